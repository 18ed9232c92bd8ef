//! The checks a trace file passed, remembered while the file stays the same.
//!
//! Reading a large trace as untrusted input pays seconds of checks before
//! the first read of its call rows (docs/schema.md "Reading untrusted
//! files": on a 10M-call file the `quick_check` of the per-call tables, the
//! pass over the call rows that checks the totals, the count of skipped
//! rows). A reader that answers many questions about one file (the MCP
//! server) keeps what passed in a [`CheckMemo`], keyed by the file's
//! [`FileIdentity`]: device, inode, size, modification and change times of
//! the database and of its `-wal`. Any write to either changes its change
//! time (which a file's owner cannot set back), a replaced file has another
//! inode, so a changed file is a new key and is checked again.
//!
//! One [`Checks`] is shared by a [`crate::Trace`], the streamed readers
//! opened on it while the file keeps the identity the trace opened
//! ([`BulkCheck::for_stream`]) and, when remembered, every later open of
//! the same file: whichever runs a check first records it, the others
//! skip it.

use crate::budget::ReadBudget;
use crate::check_cache::{CheckCache, StoredEntry, StoredPassed};
use crate::check_plan::Plan;
use crate::error::StoreError;
use crate::open::{tables, BULK_TABLES};
use crate::problems::{CallScan, InputProblems};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Files remembered at most: a server reads one trace or a few.
const REMEMBERED: usize = 8;

/// How long a file must have been left alone before what it passed is
/// remembered. File times come from a coarse clock (a few ms per tick, a
/// second on some file systems): a file checked in the same tick as its
/// last write could be written again within that tick and keep every
/// time equal. A file left alone longer than a tick when checked gets a
/// later time from any later write (git's "racily clean" rule). A trace
/// still being written is therefore checked on every open.
pub(crate) const SETTLED: Duration = Duration::from_secs(2);

/// What the file system says of one file: any write changes `ctime_ns`,
/// a replaced file changes `ino`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of `path`; None when it does not exist or cannot be read.
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }

    fn changed_ns(&self) -> i128 {
        self.mtime_ns.max(self.ctime_ns)
    }
}

/// The identity of a trace's bytes without reading them: the database's
/// stamp and its `-wal`'s (absent is part of the key: a `-wal` that
/// appears, empty or not, makes another identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileIdentity {
    db: Stamp,
    wal: Option<Stamp>,
}

impl FileIdentity {
    /// The identity of the file at `path` now; None when it cannot be read.
    pub(crate) fn of(path: &Path) -> Option<FileIdentity> {
        let db = Stamp::of(path)?;
        let mut wal = path.as_os_str().to_os_string();
        wal.push("-wal");
        Some(FileIdentity {
            db,
            wal: Stamp::of(Path::new(&wal)),
        })
    }

    /// Whether readers open the file `immutable` (no `-wal` with content),
    /// so that no connection sees it change.
    fn immutable(&self) -> bool {
        self.wal.is_none_or(|w| w.size == 0)
    }

    /// When either file last changed (wall clock, ns).
    fn changed_ns(&self) -> i128 {
        self.wal.map_or(self.db.changed_ns(), |w| {
            w.changed_ns().max(self.db.changed_ns())
        })
    }

    /// Whether neither file changed within `settled` of `now_ns` (wall clock).
    fn settled(&self, now_ns: i128, settled: Duration) -> bool {
        now_ns - self.changed_ns() > settled.as_nanos() as i128
    }

    /// How long after `now_ns` the files count as [`Self::settled`] (zero:
    /// they do now).
    fn settles_in(&self, now_ns: i128, settled: Duration) -> Duration {
        let due = self.changed_ns() + settled.as_nanos() as i128 + 1;
        Duration::from_nanos(u64::try_from(due - now_ns).unwrap_or(0))
    }
}

/// The checks one file passed and what they found.
#[derive(Debug, Default)]
pub(crate) struct Passed {
    /// SQLite's `integrity_check` of the whole file (files up to
    /// `open::FULL_CHECK_BYTES`): every table, the bulk ones included.
    pub whole: bool,
    /// `quick_check` of every table except [`BULK_TABLES`] (at open, larger files).
    pub others: bool,
    /// [`BULK_TABLES`] whose `quick_check` passed (by name).
    pub bulk: BTreeSet<&'static str>,
    /// Every bulk table the file has passed (so the file's table list
    /// need not be read again on each read of them).
    pub bulk_done: bool,
    /// The pass over the call rows (`problems::call_scan`).
    pub call_scan: Option<CallScan>,
    /// The rows readers skip (`Trace::input_problems`).
    pub problems: Option<InputProblems>,
    /// The schema version the file's tables were found to be as gpusleuth
    /// writes them (`reader::check_schema`). Kept while this process runs,
    /// not in the checks cache: it is cheap once per file, but a run's
    /// readers open each file several times.
    pub schema: Option<i64>,
}

impl Passed {
    /// Whether the `quick_check` of table `name` passed (directly, or as
    /// part of the whole file's check or the check at open).
    pub fn table(&self, name: &str) -> bool {
        self.whole
            || if BULK_TABLES.contains(&name) {
                self.bulk_done || self.bulk.contains(name)
            } else {
                self.others
            }
    }

    /// Whether every bulk table the file has passed.
    fn table_all_bulk(&self) -> bool {
        self.whole || self.bulk_done
    }

    /// Records that table `name` passed its `quick_check`. Only bulk tables
    /// are recorded one by one (by their static names: a hostile file's
    /// table names are never kept); the others pass together at open.
    pub fn pass_table(&mut self, name: &str) {
        if let Some(&b) = BULK_TABLES.iter().find(|&&b| b == name) {
            self.bulk.insert(b);
        }
    }
}

/// The checks of one file, shared (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub(crate) struct Checks(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    passed: Mutex<Passed>,
    /// Held while a reader runs checks of this file: a second reader of
    /// the same file (the MCP server's first tool call while its check
    /// ahead runs) waits for them and takes what they passed, instead of
    /// running the same seconds of checks beside them.
    turn: Mutex<()>,
}

/// How often a reader waiting for another's checks looks at its own budget.
const TURN_POLL: Duration = Duration::from_millis(5);

impl Checks {
    /// Checks starting from what `passed` says passed.
    fn of(passed: Passed) -> Checks {
        Checks(Arc::new(Shared {
            passed: Mutex::new(passed),
            turn: Mutex::new(()),
        }))
    }

    /// The state, read or updated. A poisoned lock only means a reader
    /// panicked between two updates of plain values: each is still whole.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Passed> {
        self.0.passed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This reader's turn to run checks of the file, once no other reader
    /// runs any; waiting ends with the reader's budget (its deadline, a
    /// cancelled call), as its own checks would.
    fn turn(&self, path: &Path, budget: &ReadBudget) -> Result<MutexGuard<'_, ()>, StoreError> {
        loop {
            match self.0.turn.try_lock() {
                Ok(g) => return Ok(g),
                // A reader that panicked while checking recorded nothing.
                Err(std::sync::TryLockError::Poisoned(e)) => return Ok(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if let Some(why) = budget.stop_reason() {
                return Err(StoreError::file(
                    path,
                    format!("integrity check stopped: {why}"),
                ));
            }
            std::thread::sleep(TURN_POLL);
        }
    }

    /// Runs the `quick_check` of the [`BULK_TABLES`] the file has that did
    /// not pass yet, through `conn` alone.
    #[cfg(test)]
    pub(crate) fn ensure_bulk(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
    ) -> Result<(), StoreError> {
        self.ensure_bulk_with(conn, path, budget, &Helpers::new(path, budget, None))
    }

    /// The same, side by side on `helpers`' connections (`check_plan`).
    /// Checks run without the lock held (they take seconds; a second reader
    /// may run the same check meanwhile).
    pub(crate) fn ensure_bulk_with(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
        helpers: &Helpers,
    ) -> Result<(), StoreError> {
        if self.lock().table_all_bulk() {
            return Ok(());
        }
        let _turn = self.turn(path, budget)?;
        // Another reader's checks may have passed them while this one waited.
        if self.lock().table_all_bulk() {
            return Ok(());
        }
        let names = self.bulk_todo(conn, path)?;
        let outcome = Plan::tables(&names, 0)
            .run(conn, path, budget, helpers.workers(), || helpers.open())?;
        self.record(outcome);
        Ok(())
    }

    /// Every check a first read pays, side by side on `helpers`'
    /// connections (`check_plan`): the bulk tables' `quick_check`, the pass
    /// over the call rows and the skipped-row counts of a trace of schema
    /// `version`, each unless it passed already. Returns the pass and the
    /// counts; the counts are None (not recorded) for a file whose totals
    /// overflow, which its readers refuse.
    pub(crate) fn ensure_counts(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
        version: i64,
        helpers: &Helpers,
    ) -> Result<(CallScan, Option<InputProblems>), StoreError> {
        if let Some(done) = self.counted() {
            return Ok(done);
        }
        let _turn = self.turn(path, budget)?;
        // Another reader's checks may have passed them while this one waited.
        if let Some(done) = self.counted() {
            return Ok(done);
        }
        let known = self.lock().call_scan;
        let names = if self.lock().table_all_bulk() {
            Vec::new()
        } else {
            self.bulk_todo(conn, path)?
        };
        // Passed in an earlier run (the checks cache keeps the tables that
        // passed, not that they were all the file has: its schema, just
        // read, says so): nothing to run. The counts were run again on
        // every read of a cached file (0.4 s of a 10M-call file's window).
        if names.is_empty() {
            let mut p = self.lock();
            p.bulk_done = true;
            drop(p);
            if let Some(done) = self.counted() {
                return Ok(done);
            }
        }
        let alloc = crate::open::has_table(conn, "allocator_events")
            .map_err(|e| StoreError::file(path, crate::open::short(&e)))?;
        let workers = helpers.workers();
        let plan = Plan::counts(&names, version, alloc, known, workers);
        #[cfg(test)]
        crate::open::test_seams::PLANS_RUN.with(|c| c.set(c.get() + 1));
        let outcome = plan.run(conn, path, budget, workers, || helpers.open())?;
        let calls = outcome.calls;
        let problems = outcome.problems.clone();
        self.record(outcome);
        let calls = calls.ok_or_else(|| StoreError::file(path, "the call-row pass did not run"))?;
        let problems = problems.filter(|_| !calls.totals_overflow);
        let mut p = self.lock();
        p.call_scan = Some(calls);
        if let Some(pr) = &problems {
            p.problems = Some(pr.clone());
        }
        Ok((calls, problems))
    }

    /// What [`Checks::ensure_counts`] returns, when every check it runs
    /// passed already.
    fn counted(&self) -> Option<(CallScan, Option<InputProblems>)> {
        let p = self.lock();
        match (p.call_scan, &p.problems) {
            (Some(c), Some(pr)) if p.table_all_bulk() => Some((c, Some(pr.clone()))),
            _ => None,
        }
    }

    /// The file's bulk tables whose `quick_check` has not passed, by their
    /// static names.
    fn bulk_todo(&self, conn: &Connection, path: &Path) -> Result<Vec<&'static str>, StoreError> {
        let names = tables(conn).map_err(|e| StoreError::file(path, crate::open::short(&e)))?;
        let p = self.lock();
        Ok(BULK_TABLES
            .iter()
            .copied()
            .filter(|b| names.iter().any(|n| n == b) && !p.table(b))
            .collect())
    }

    /// Records what a plan passed: it ran every bulk table the file had
    /// not passed, so all of them have now.
    fn record(&self, outcome: crate::check_plan::Outcome) {
        #[cfg(test)]
        crate::open::test_seams::CHECKS_RUN.with(|c| c.set(c.get() + outcome.checks_elsewhere));
        let mut p = self.lock();
        for n in &outcome.tables {
            p.pass_table(n);
        }
        p.bulk_done = true;
    }
}

/// Where a plan's helper threads get their connections: the file again,
/// opened as every reader opens it, only while it is still the file the
/// trace opened and checked (`id`) and cannot change under a reader
/// (no `-wal` with content: the file is opened `immutable`). Otherwise the
/// plan runs on the trace's connection alone.
pub(crate) struct Helpers<'a> {
    path: &'a Path,
    budget: &'a ReadBudget,
    id: Option<FileIdentity>,
}

impl<'a> Helpers<'a> {
    pub(crate) fn new(path: &'a Path, budget: &'a ReadBudget, id: Option<FileIdentity>) -> Self {
        Helpers { path, budget, id }
    }

    /// Connections a plan may use, the caller's included.
    pub(crate) fn workers(&self) -> usize {
        match self.id {
            Some(id) if id.immutable() => crate::check_plan::workers(),
            _ => 1,
        }
    }

    /// A helper's connection; None when the file is no longer the one the
    /// trace opened (the helper then does not help).
    pub(crate) fn open(&self) -> Option<Connection> {
        let id = self.id?;
        let conn = crate::open::open_trace_file(self.path, self.budget).ok()?;
        // Taken once this connection has the file open, as `for_stream` does.
        (FileIdentity::of(self.path) == Some(id)).then_some(conn)
    }
}

/// Whether the bulk tables of one opened trace were read: shared by a
/// [`crate::Trace`] and the streamed readers opened on it, with the
/// file's [`Checks`]. A command counts the rows it skipped only when it
/// read such rows (`Trace::input_problems_of_reads`): that depends on what
/// this trace read, not on what an earlier open of the same file read.
#[derive(Debug, Clone)]
pub(crate) struct BulkCheck {
    read: Arc<AtomicBool>,
    checks: Checks,
    /// The file's identity when the trace opened it (None when it changed
    /// while being opened or could not be read).
    id: Option<FileIdentity>,
}

impl BulkCheck {
    pub(crate) fn new(checks: Checks, id: Option<FileIdentity>) -> BulkCheck {
        BulkCheck {
            read: Arc::new(false.into()),
            checks,
            id,
        }
    }

    /// The file's identity when the trace opened it (None when it changed
    /// while being opened): helper connections read it only while it holds.
    pub(crate) fn identity(&self) -> Option<FileIdentity> {
        self.id
    }

    /// The checks for a streamed reader that opened `path` again (its own
    /// connection): the trace's, unless the file is no longer the one the
    /// trace opened (replaced or written since). Then the stream checks
    /// what it reads itself instead of trusting checks of other bytes;
    /// whether rows were read is still the trace's.
    pub(crate) fn for_stream(&self, path: &Path) -> BulkCheck {
        match self.id {
            Some(id) if FileIdentity::of(path) != Some(id) => BulkCheck {
                read: self.read.clone(),
                checks: Checks::default(),
                id: None,
            },
            _ => self.clone(),
        }
    }

    /// The checks of a known identity: on a [`BulkCheck::for_stream`], the
    /// trace's when the file is still the one the trace opened; None when
    /// it was replaced, written, or changing when the trace opened it (the
    /// connection then checks for itself what it reads).
    pub(crate) fn checks_of_identity(&self) -> Option<&Checks> {
        self.id.map(|_| &self.checks)
    }

    /// Whether this trace (or a stream on it) read its bulk tables.
    pub(crate) fn read(&self) -> bool {
        self.read.load(Ordering::Acquire)
    }

    /// The file's checks.
    pub(crate) fn checks(&self) -> &Checks {
        &self.checks
    }

    /// Before a read of the bulk tables through `conn`: their check, unless
    /// it passed (for this trace or, remembered, for this file).
    pub(crate) fn ensure(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
    ) -> Result<(), StoreError> {
        let helpers = Helpers::new(path, budget, self.id);
        self.checks.ensure_bulk_with(conn, path, budget, &helpers)?;
        self.read.store(true, Ordering::Release);
        Ok(())
    }

    /// Before a read that needs the pass over the call rows (a totals
    /// check) or the skipped-row counts: every check a first read pays,
    /// side by side (`Checks::ensure_counts`). A reader that checks the
    /// totals counts the skipped rows after its reads: one plan makes both,
    /// so that the counts fill the cores the table checks leave idle.
    pub(crate) fn ensure_counts(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
        version: i64,
    ) -> Result<(CallScan, Option<InputProblems>), StoreError> {
        let helpers = Helpers::new(path, budget, self.id);
        let found = self
            .checks
            .ensure_counts(conn, path, budget, version, &helpers)?;
        self.read.store(true, Ordering::Release);
        Ok(found)
    }
}

/// What the files a process reads passed, while each stays the same: for
/// readers that open the same files again and again (the MCP server keeps
/// one for its life). Cheap to clone (shared). At most a few files. One
/// made by [`CheckMemo::on_disk`] also starts from, and [`CheckMemo::save`]s
/// into, the user's cache (`check_cache`): the command line's runs share
/// what each paid for.
#[derive(Debug, Clone)]
pub struct CheckMemo {
    entries: Arc<Mutex<Vec<Entry>>>,
    settled: Duration,
    capacity: usize,
    disk: Option<CheckCache>,
}

#[derive(Debug)]
struct Entry {
    id: FileIdentity,
    checks: Checks,
    used: u64,
    /// What the cache on disk knows of this file (None: nothing), so that
    /// saving writes only what this process learnt.
    saved: Option<StoredPassed>,
    /// When this process or the one that saved it last used it (s).
    used_s: u64,
}

impl Default for CheckMemo {
    fn default() -> Self {
        CheckMemo::new()
    }
}

impl CheckMemo {
    pub fn new() -> CheckMemo {
        CheckMemo::settling(SETTLED)
    }

    /// A memo that remembers files left alone for `settled` (tests).
    pub(crate) fn settling(settled: Duration) -> CheckMemo {
        CheckMemo {
            entries: Arc::default(),
            settled,
            capacity: REMEMBERED,
            disk: None,
        }
    }

    /// A memo that starts from the user's cache of checks on disk (where
    /// the environment names one: `check_cache`) and saves into it.
    pub fn on_disk() -> CheckMemo {
        match CheckCache::from_env() {
            Some(cache) => CheckMemo::with_cache(cache, SETTLED),
            None => CheckMemo::new(),
        }
    }

    /// A memo on `cache` (tests choose the directory and the settling time).
    pub(crate) fn with_cache(cache: CheckCache, settled: Duration) -> CheckMemo {
        let entries = cache
            .load()
            .into_iter()
            .enumerate()
            .map(|(i, e)| Entry {
                id: e.id,
                checks: Checks::of(e.passed.passed()),
                // Most recently used first in the cache: older, lower ticks.
                used: (crate::check_cache::KEPT - i) as u64,
                saved: Some(e.passed),
                used_s: e.used_s,
            })
            .collect();
        CheckMemo {
            entries: Arc::new(Mutex::new(entries)),
            settled,
            capacity: crate::check_cache::KEPT,
            disk: Some(cache),
        }
    }

    /// Writes what this process learnt of its files into the cache on disk
    /// (a memo without one: nothing). Best effort: a cache that cannot be
    /// written costs only checks paid again by a later run.
    pub fn save(&self) {
        let Some(cache) = &self.disk else {
            return;
        };
        let news: Vec<StoredEntry> = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .iter_mut()
                .filter_map(|e| {
                    let now = StoredPassed::of(&e.checks.lock());
                    if now.is_empty() || e.saved.as_ref() == Some(&now) {
                        return None;
                    }
                    e.saved = Some(now.clone());
                    Some(StoredEntry {
                        id: e.id,
                        passed: now,
                        used_s: e.used_s,
                    })
                })
                .collect()
        };
        if !news.is_empty() {
            cache.save(news);
        }
    }

    /// The checks for a file whose identity was `before` just before it
    /// was opened and `after` once the connection had it open: the
    /// remembered ones when both agree and the file had settled (see
    /// [`SETTLED`]), else a fresh set that only this open shares (a file
    /// changing or replaced while being opened).
    pub(crate) fn checks_for(
        &self,
        before: Option<FileIdentity>,
        after: Option<FileIdentity>,
    ) -> Checks {
        let (Some(id), Some(after)) = (before, after) else {
            return Checks::default();
        };
        let now = now_ns();
        if id != after || !id.settled(now, self.settled) {
            return Checks::default();
        }
        let now_s = (now / 1_000_000_000).max(0) as u64;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let tick = entries.iter().map(|e| e.used).max().unwrap_or(0) + 1;
        if let Some(e) = entries.iter_mut().find(|e| e.id == id) {
            e.used = tick;
            e.used_s = now_s;
            return e.checks.clone();
        }
        if entries.len() >= self.capacity {
            // The least recently used file is forgotten.
            if let Some(i) = (0..entries.len()).min_by_key(|&i| entries[i].used) {
                entries.swap_remove(i);
            }
        }
        let checks = Checks::default();
        entries.push(Entry {
            id,
            checks: checks.clone(),
            used: tick,
            saved: None,
            used_s: now_s,
        });
        checks
    }

    /// Whether what passed can be saved into the user's cache on disk: a
    /// memo made by [`CheckMemo::on_disk`] where the environment names a
    /// cache whose directory is there or can be made private to this user
    /// (made now, if missing).
    pub fn saves(&self) -> bool {
        self.disk.as_ref().is_some_and(CheckCache::usable)
    }

    /// How long until the file at `path` has been left alone for the
    /// settling time (zero: it has), so that [`CheckMemo::check_ahead`]
    /// checks and remembers it; None when it cannot be read. For a writer
    /// that knows a file is complete (the tracer): it waits this long, then
    /// checks ahead. Another write meanwhile only makes the wait longer.
    pub fn settles_in(&self, path: &Path) -> Option<Duration> {
        Some(FileIdentity::of(path)?.settles_in(now_ns(), self.settled))
    }

    /// Runs every check of the trace at `path` that this memo does not
    /// hold yet (the check at open, the per-call tables' `quick_check`, the
    /// call-row pass, the skipped-row counts) and saves what passed, so that
    /// a later read skips them: a server that knows which file it will be
    /// asked about checks it before the first question. Returns false, and
    /// reads nothing, for a file changed within the settling time (what it
    /// passed would not be remembered: a trace still being written). Errors
    /// are the checks' (a damaged file), for the caller to drop or report.
    pub fn check_ahead(&self, path: &Path, budget: ReadBudget) -> Result<bool, StoreError> {
        match FileIdentity::of(path) {
            Some(id) if id.settled(now_ns(), self.settled) => {}
            _ => return Ok(false),
        }
        crate::Trace::open_remembered(path, budget, self)?.input_problems()?;
        self.save();
        Ok(true)
    }

    /// Files remembered now (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }
}

/// Wall-clock time in ns (file times are wall-clock).
fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open::test_seams::{checks_run, FULL_CHECK_BYTES};
    use crate::{run_readonly_sql_remembered, SqlLimits, Trace};

    fn budget() -> ReadBudget {
        ReadBudget::new(Duration::from_secs(30))
    }

    /// A fresh directory holding a copy of the example trace as `t.db`.
    fn copy(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("gs-checked-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db");
        let path = dir.join("t.db");
        std::fs::copy(src, &path).expect("copy");
        (dir, path)
    }

    use crate::open::damaged_root as damaged;

    /// Opens remembered and reads what needs every check: the call rows'
    /// table check, the call-row pass and the skipped-row counts.
    fn read_all(path: &Path, memo: &CheckMemo) -> Result<InputProblems, StoreError> {
        Trace::open_remembered(path, budget(), memo)?.input_problems()
    }

    /// Both sizes of file: checked whole at open, and (the threshold lowered
    /// on this thread) the large-file path, bulk tables checked on first read.
    fn each_size(test: impl Fn(&str)) {
        FULL_CHECK_BYTES.with(|b| b.set(None));
        test("whole");
        FULL_CHECK_BYTES.with(|b| b.set(Some(0)));
        test("tables");
        FULL_CHECK_BYTES.with(|b| b.set(None));
    }

    #[test]
    fn checks_a_file_passed_are_not_run_again_while_it_stays_the_same() {
        each_size(|size| {
            let (dir, path) = copy(&format!("same-{size}"));
            let memo = CheckMemo::settling(Duration::ZERO);
            let n = checks_run();
            let first = read_all(&path, &memo).expect("intact");
            assert!(checks_run() > n, "{size}: the first open checks");
            let n = checks_run();
            let again = read_all(&path, &memo).expect("still intact");
            assert_eq!(checks_run(), n, "{size}: nothing checked again");
            assert_eq!(first, again, "{size}");
            // Without the memo every open checks.
            let n = checks_run();
            Trace::open_with(&path, budget())
                .and_then(|t| t.input_problems())
                .expect("intact");
            assert!(checks_run() > n, "{size}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// Renames over `path` a copy of it with an expression index (a
    /// schema every reader refuses) under a new inode.
    fn replace_with_odd_schema(dir: &Path, path: &Path) {
        let other = dir.join("odd.db");
        std::fs::copy(path, &other).expect("copy");
        let c = Connection::open(&other).expect("open copy");
        c.execute_batch("CREATE INDEX odd ON notes(length(text))")
            .expect("expression index");
        drop(c);
        std::fs::rename(&other, path).expect("rename");
    }

    /// The schema check runs once per file and process, through the memo
    /// (another open) and the trace (its streams, its finding rollups),
    /// and again for a file replaced since: every reader refuses that one.
    #[test]
    fn a_files_schema_is_checked_once_while_it_stays_the_same() {
        let schema_checks = || crate::reader::SCHEMA_CHECKS.with(|n| n.get());
        for version in ["example", "written"] {
            let (dir, path) = copy(&format!("schema-{version}"));
            if version == "written" {
                std::fs::remove_file(&path).expect("rm");
                crate::test_files::written_with(&path, []);
            }
            let memo = CheckMemo::settling(Duration::ZERO);
            let n = schema_checks();
            let trace = Trace::open_remembered(&path, budget(), &memo).expect("open");
            assert_eq!(schema_checks(), n + 1, "{version}: the first open checks");
            let again = Trace::open_remembered(&path, budget(), &memo).expect("again");
            crate::stream::Rows::open(&trace).expect("stream");
            crate::finding_rollups::finding_inputs(&again, None).expect("rollups");
            assert_eq!(schema_checks(), n + 1, "{version}: nothing checked again");
            // Without the memo every open checks.
            Trace::open_with(&path, budget()).expect("open");
            assert_eq!(schema_checks(), n + 2, "{version}");

            replace_with_odd_schema(&dir, &path);
            fn refused<T>(version: &str, r: Result<T, StoreError>) {
                match r {
                    Ok(_) => panic!("{version}: a file of another schema was read"),
                    Err(e) => {
                        let e = e.to_string();
                        assert!(e.contains("indexes an expression"), "{version}: {e}");
                    }
                }
            }
            refused(version, Trace::open_remembered(&path, budget(), &memo));
            refused(version, crate::stream::Rows::open(&trace));
            refused(
                version,
                crate::finding_rollups::finding_inputs(&again, None),
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Damages the `calls` root page of `path` by a write in place that
    /// keeps the file's size, past one tick of the file system's clock
    /// (see `SETTLED`) after whatever came before.
    fn damage_in_place(path: &Path) {
        let bytes = damaged(path, "calls");
        let len = std::fs::metadata(path).expect("stat").len();
        std::thread::sleep(Duration::from_millis(50));
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("open for writing");
            f.write_all(&bytes).expect("write in place");
        }
        assert_eq!(
            std::fs::metadata(path).expect("stat").len(),
            len,
            "same size"
        );
    }

    /// A write in place that keeps the size (one byte of a page) after the
    /// checks passed: the file is checked again and the damage found.
    #[test]
    fn a_file_changed_in_place_is_checked_again() {
        each_size(|size| {
            let (dir, path) = copy(&format!("inplace-{size}"));
            let memo = CheckMemo::settling(Duration::ZERO);
            read_all(&path, &memo).expect("intact");
            damage_in_place(&path);
            let e = read_all(&path, &memo)
                .expect_err("damage found")
                .to_string();
            assert!(e.contains("damaged"), "{size}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// Renames a damaged copy of `path` over it (a new inode).
    fn replace_with_damaged(dir: &Path, path: &Path) {
        let other = dir.join("other.db");
        std::fs::write(&other, damaged(path, "calls")).expect("write");
        std::fs::rename(&other, path).expect("rename");
    }

    /// A damaged file renamed over the checked one (a new inode).
    #[test]
    fn a_replaced_file_is_checked_again() {
        each_size(|size| {
            let (dir, path) = copy(&format!("renamed-{size}"));
            let memo = CheckMemo::settling(Duration::ZERO);
            read_all(&path, &memo).expect("intact");
            replace_with_damaged(&dir, &path);
            let e = read_all(&path, &memo)
                .expect_err("damage found")
                .to_string();
            assert!(e.contains("damaged"), "{size}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// A stream opens the file again: when it is no longer the file its
    /// trace opened and checked, the stream checks it before reading.
    #[test]
    fn a_stream_on_a_file_replaced_after_its_trace_opened_checks_it() {
        each_size(|size| {
            let (dir, path) = copy(&format!("stream-{size}"));
            let trace = Trace::open_with(&path, budget()).expect("open");
            trace.input_problems().expect("intact: every check ran");
            replace_with_damaged(&dir, &path);
            let rows = crate::stream::Rows::open(&trace).expect("the cheap checks pass");
            let e = rows
                .for_each_call::<StoreError>(&Default::default(), |_| Ok(()))
                .expect_err("damage found")
                .to_string();
            // The check's words, not SQLite's error from reading the page.
            assert!(e.contains("damaged"), "{size}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// A file written within `SETTLED` of its check is not remembered: a
    /// second write in the same tick of the file clock could keep its times.
    #[test]
    fn a_file_changed_just_before_its_check_is_not_remembered() {
        let (dir, path) = copy("racy");
        let memo = CheckMemo::new();
        read_all(&path, &memo).expect("intact");
        assert_eq!(memo.len(), 0);
        let n = checks_run();
        read_all(&path, &memo).expect("intact");
        assert!(checks_run() > n, "checked again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wal_appearing_or_changing_is_another_identity() {
        let (dir, path) = copy("wal");
        let plain = FileIdentity::of(&path).expect("identity");
        let wal = dir.join("t.db-wal");
        std::fs::write(&wal, b"").expect("empty wal");
        let empty = FileIdentity::of(&path).expect("identity");
        assert_ne!(plain, empty, "an empty -wal counts");
        std::thread::sleep(Duration::from_millis(50));
        std::fs::write(&wal, b"x").expect("wal");
        assert_ne!(empty, FileIdentity::of(&path).expect("identity"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_memo_keeps_a_few_files() {
        let (dir, path) = copy("bound");
        let memo = CheckMemo::settling(Duration::ZERO);
        for i in 0..REMEMBERED + 3 {
            let p = dir.join(format!("{i}.db"));
            std::fs::copy(&path, &p).expect("copy");
            Trace::open_remembered(&p, budget(), &memo).expect("open");
        }
        assert_eq!(memo.len(), REMEMBERED);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A later run (a new memo on the same cache directory) skips what an
    /// earlier run's checks passed, and checks again a file changed since,
    /// in place and keeping its size, and finds the damage.
    #[test]
    fn checks_saved_on_disk_are_not_run_again_by_a_later_run() {
        each_size(|size| {
            let (dir, path) = copy(&format!("disk-{size}"));
            let cache = || {
                CheckMemo::with_cache(
                    crate::check_cache::CheckCache::at(dir.join("cache")),
                    Duration::ZERO,
                )
            };
            let first_run = cache();
            let first = read_all(&path, &first_run).expect("intact");
            first_run.save();
            let (n, plans) = (checks_run(), crate::open::test_seams::plans_run());
            let again = read_all(&path, &cache()).expect("still intact");
            assert_eq!(checks_run(), n, "{size}: nothing checked by the second run");
            let plans = crate::open::test_seams::plans_run() - plans;
            assert_eq!(plans, 0, "{size}: nothing counted again by the second run");
            assert_eq!(first, again, "{size}: the counts come back");
            // A run that learnt nothing new leaves the cache as it was.
            let before = std::fs::read(dir.join("cache/checks.json")).expect("cache");
            let third = cache();
            read_all(&path, &third).expect("intact");
            third.save();
            assert_eq!(
                std::fs::read(dir.join("cache/checks.json")).expect("cache"),
                before
            );
            damage_in_place(&path);
            let e = read_all(&path, &cache())
                .expect_err("damage found")
                .to_string();
            assert!(e.contains("damaged"), "{size}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// A reader of a file whose checks another reader is running (the MCP
    /// server's first tool call while its check ahead runs) waits for them
    /// and runs none itself; its own budget ends the wait.
    #[test]
    fn a_reader_waits_for_the_checks_another_is_running() {
        FULL_CHECK_BYTES.with(|b| b.set(Some(0)));
        let (dir, path) = copy("turn");
        let memo = CheckMemo::settling(Duration::ZERO);
        let t = Trace::open_remembered(&path, budget(), &memo).expect("intact");
        let checks = t.bulk_check().checks().clone();
        // Another reader holds the turn: a reader with 100 ms to spend
        // waits it out, runs no check and says why it stopped.
        let held = checks.0.turn.lock().expect("turn");
        let short = ReadBudget::new(Duration::from_millis(100));
        let n = checks_run();
        let e = Trace::open_remembered(&path, short, &memo)
            .and_then(|t| t.input_problems())
            .expect_err("stopped waiting")
            .to_string();
        assert!(e.contains("integrity check stopped"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert_eq!(checks_run(), n, "no check ran while another reader's did");
        drop(held);

        // Two readers at once: one runs the checks, the other takes them.
        let (dir2, path2) = copy("turn-both");
        let memo = CheckMemo::settling(Duration::ZERO);
        let alone = {
            let fresh = CheckMemo::settling(Duration::ZERO);
            let n = checks_run();
            read_all(&path2, &fresh).expect("intact");
            checks_run() - n
        };
        let start = std::sync::Barrier::new(2);
        let counts: Vec<usize> = std::thread::scope(|s| {
            let run = || {
                FULL_CHECK_BYTES.with(|b| b.set(Some(0)));
                let t = Trace::open_remembered(&path2, budget(), &memo).expect("intact");
                start.wait();
                let n = checks_run();
                t.input_problems().expect("intact");
                checks_run() - n
            };
            let a = s.spawn(run);
            let b = s.spawn(run);
            vec![a.join().expect("a"), b.join().expect("b")]
        });
        let opened = {
            // What the open itself checks, paid by each reader above.
            let fresh = CheckMemo::settling(Duration::ZERO);
            let n = checks_run();
            Trace::open_remembered(&path2, budget(), &fresh).expect("intact");
            checks_run() - n
        };
        assert_eq!(
            counts.iter().sum::<usize>(),
            alone - opened,
            "the bulk checks ran once between two readers: {counts:?}"
        );
        FULL_CHECK_BYTES.with(|b| b.set(None));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir2);
    }

    /// Checking ahead leaves nothing for a later read to check, and does
    /// nothing on a file that has not settled.
    #[test]
    fn checking_ahead_pays_every_check_before_the_first_read() {
        each_size(|size| {
            let (dir, path) = copy(&format!("ahead-{size}"));
            let memo = CheckMemo::settling(Duration::ZERO);
            assert!(memo.check_ahead(&path, budget()).expect("intact"));
            let n = checks_run();
            read_all(&path, &memo).expect("intact");
            assert_eq!(checks_run(), n, "{size}: nothing left to check");
            let fresh = CheckMemo::new();
            let n = checks_run();
            assert!(!fresh.check_ahead(&path, budget()).expect("not read"));
            assert_eq!(
                checks_run(),
                n,
                "{size}: a file just written is not checked ahead"
            );
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// A file waited for as long as `settles_in` says is checked ahead;
    /// one written meanwhile must be waited for again.
    #[test]
    fn a_file_waited_for_until_it_settles_is_checked_ahead() {
        let (dir, path) = copy("settles");
        let memo = CheckMemo::settling(Duration::from_millis(300));
        let wait = memo.settles_in(&path).expect("readable");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(300),
            "{wait:?}"
        );
        assert!(!memo.check_ahead(&path, budget()).expect("not yet"));
        std::thread::sleep(wait);
        assert_eq!(memo.settles_in(&path), Some(Duration::ZERO));
        assert!(memo.check_ahead(&path, budget()).expect("intact"));
        std::fs::write(dir.join("t.db-wal"), b"").expect("a -wal appears");
        assert!(memo.settles_in(&path).expect("readable") > Duration::ZERO);
        assert_eq!(memo.settles_in(&dir.join("gone.db")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a settled file nothing is kept on disk either.
    #[test]
    fn a_file_just_written_is_not_saved() {
        let (dir, path) = copy("disk-racy");
        let memo = CheckMemo::with_cache(
            crate::check_cache::CheckCache::at(dir.join("cache")),
            SETTLED,
        );
        read_all(&path, &memo).expect("intact");
        memo.save();
        assert!(!dir.join("cache/checks.json").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// MCP `sql`: the tables a statement reads are checked once; a change
    /// in place is checked again. Both sizes of file.
    #[test]
    fn sql_statements_share_the_checks() {
        each_size(|size| {
            let (dir, path) = copy(&format!("sql-{size}"));
            let memo = CheckMemo::settling(Duration::ZERO);
            let sql = |memo: &CheckMemo| {
                let limits = SqlLimits::default();
                run_readonly_sql_remembered(
                    &path,
                    "SELECT count(*) FROM calls",
                    &limits,
                    &budget(),
                    memo,
                )
            };
            sql(&memo).expect("intact");
            let n = checks_run();
            sql(&memo).expect("intact");
            assert_eq!(checks_run(), n, "{size}: nothing checked again");
            // A trace opened after the statement skips what it checked.
            let n = checks_run();
            let t = Trace::open_remembered(&path, budget(), &memo).expect("open");
            t.input_problems().expect("counted");
            if size == "tables" {
                // Only the other tables at open, and the bulk tables the
                // statement did not read.
                assert!(checks_run() > n, "{size}");
            }
            std::thread::sleep(Duration::from_millis(50));
            let bytes = damaged(&path, "calls");
            std::fs::write(&path, bytes).expect("write in place");
            let e = sql(&memo).expect_err("damage found").to_string();
            assert!(e.contains("damaged"), "{size}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        });
    }
}
