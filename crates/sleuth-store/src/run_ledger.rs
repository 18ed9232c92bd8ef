//! A run's memory ledger carried by the tracer across its files (issue 16).
//!
//! `trace --rotate` writes a run of complete files (`crate::run`). Each
//! file stores its own ledger (`crate::ledger_rollup`), which cannot know
//! the allocations of earlier files: a reader of the whole run
//! (`explain --db DIR`) replayed every memory call of every file, a cost
//! that grows with the run, and once `--keep N` pruned files it could not
//! know what they allocated. The tracer completes its files one at a time,
//! in order, so the completion of file k+1 starts its replay from the
//! ledger state the completion of file k left ([`RunLink`]) and stores,
//! beside the file's own ledger, the run's ledger up to the end of this
//! file: table `run_ledger(pid, ledger)` (a table of its own, not rows
//! marked in `ledger_rollup`, so every reader of one file, older ones
//! included, reads that file's ledger as before). Meta keys say what it
//! covers: `run_id` (random per `trace --rotate`), `run_file` (this file's
//! number), `run_ledger_from` (the first file the carried state starts
//! from) and `run_ledger = 1` once the table is complete.
//!
//! What is carried in memory from one completion to the next
//! ([`Carried`]): the run's `LedgerBuilder` (per process: live
//! allocations, failed allocations, distinct freed and re-allocated sizes,
//! threads' devices, and the timeline, bounded apart) and the stacks its
//! ledgers name. Past [`MAX_CARRIED_ENTRIES`] entries the chain stops: the
//! file still stores the run's ledger up to itself, the next file starts a
//! new chain and says so in a note, and readers replay (see below).
//! A file whose completion failed or was cut short leaves the chain broken
//! the same way (the state is taken out before the completion and put back
//! only after its commit).
//!
//! A file's start (round 20): on a chain from the run's file 1, the
//! completion first stores the carried state as it came into the file,
//! `run_ledger_begin(pid, state, sites)` (`LedgerBuilder::each_state`,
//! one process at a time, and the per-site tallies carried beside it),
//! with `meta.run_ledger_begin = 1` and `run_ledger_begin_until` (the
//! latest return time in it). `memory --at` of the run takes the state of
//! the file holding the moment and replays that file alone ([`begin_state`],
//! `run_explain`), where it replayed every file before; the state is
//! untrusted input, checked by `LedgerBuilder::from_states` and here.
//!
//! Sites: stack ids are hashes of the frames, and the tracer stores a
//! stack in each file that has a call of it. A carried allocation may have
//! been made in a file `--keep` deleted, so the completion copies the stack
//! of every site the run's ledger names into the file (from the file
//! itself or from the stacks carried): a reader of the last file reads
//! every label the run's ledger needs.
//!
//! Processes that exit (round 47): the completion of the file a process
//! exited in stores its final ledger (its `run_ledger` row, as for any
//! process) and its final replay state (`run_ledger_exited`, the shape of
//! `run_ledger_begin`; read only on a chain from file 1), then retires it
//! from the builder and the tallies ([`RetiredPids`]; `meta.run_ledger_retired`
//! counts them): what is carried is what is alive. Readers take a retired
//! process from the file it exited in ([`stored_over`], [`begin_state_over`];
//! its carried allocator views too: `RunLean::carried_views`). A retired
//! pid that calls again is another process (a reused pid): it starts
//! afresh in the builder and the chain goes on (round 53; it started a new
//! chain before, which `--keep` then cut off from every earlier file).
//! Readers take each pid from the newest file that lists it: the run's
//! answer at its end is the latest process of that pid, and a replay of
//! the files (older runs, a broken chain) adds both up under the one pid.
//!
//! Readers ([`Chain`]): the last finished file's run ledger answers for
//! the files read only when every one of them carries a link of the same
//! run and chain, numbered as its name says, with no gap. Anything else
//! (an older file, a gap, another run's file, a restarted chain) makes the
//! reader replay the memory calls, as before, and say why in a note. Every
//! value read back is range-checked (`stored_json`).
//! Docs: docs/schema.md "Run ledger".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::json_column::{insert_row, json, text_of, Col};
use crate::reader::Trace;
use crate::stream::SiteTally;
use crate::StoreError;
use rusqlite::Connection;
use sleuth_core::findings::inputs::PinnedState;
use sleuth_core::ledger::{LedgerBuilder, ProcessLedger, ProcessState};
use sleuth_core::sites::Stack;
use sleuth_core::{CallEvent, TraceData};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Past this many entries held by the carried builder
/// (`LedgerBuilder::held_entries`: live allocations, failed allocations,
/// distinct churn sizes, threads; with the pinned ranges and site tallies)
/// the chain stops. About 100 bytes each with the hash tables' overhead,
/// so ~25 MB; while a file's run ledger is stored, its answer's lists
/// (`LedgerBuilder::bare_ledgers`, no clone of the builder) and one
/// process's start state (`store_begin`, its JSON written in pieces when
/// long: `crate::json_column`) are held beside it. What is live bounds the
/// tracer's memory, not the trace's length: 65,536 live allocations peaked
/// at 83–85 MB with `--rotate 1s` (docs/benchmarks.md, round 21).
pub const MAX_CARRIED_ENTRIES: usize = 250_000;

/// What one process counts toward [`MAX_CARRIED_ENTRIES`] besides its
/// entries: its replay's own tables, timeline and peak, and its sites'
/// stacks, held however few allocations it made. Until round 47 a process
/// that exited stayed in the run's carried ledger (now it is retired at
/// its exit: see the module's "Processes that exit"), so a node agent
/// that sees short-lived CUDA processes come and go carried more of them
/// into every file: 8,000 processes of one allocation each grew a
/// `--rotate 1s` tracer by about 3.2 KB each (82.6 MB peak and growing)
/// while each counted 3 entries. Counted as 64, such a run's chain
/// stopped after about 3,800 processes and started again from the next
/// file (a reader of both replays): 12,000 processes peaked at 60.6 MB
/// with the default 8M ring on the 2-vCPU VM (round 45), but 68.1–68.6 MB
/// on a 16-core host, whose tracer starts ~15 MB higher (round 46). Counted
/// as 128, the chain stops after about 1,900 processes (the carried part
/// halved; a churning node's readers replay a little more often).
pub const PROCESS_ENTRIES: usize = 128;

/// The pids the carried ledger retired at their exit: one bit each below
/// [`RetiredPids::BITS`] (the kernel's `PID_MAX_LIMIT`, 2^22 on 64-bit
/// Linux: at most 512 KiB however many processes a node agent's run sees
/// come and go), a set above it (no kernel pid; counted toward the bound).
#[derive(Default)]
pub(crate) struct RetiredPids {
    bits: Vec<u64>,
    above: BTreeSet<u32>,
    count: usize,
}

impl RetiredPids {
    const BITS: u32 = 1 << 22;

    fn insert(&mut self, pid: u32) {
        if pid >= Self::BITS {
            self.count += usize::from(self.above.insert(pid));
            return;
        }
        let (word, bit) = ((pid / 64) as usize, pid % 64);
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        if self.bits[word] & (1 << bit) == 0 {
            self.bits[word] |= 1 << bit;
            self.count += 1;
        }
    }

    /// (Tests: since round 53 a retired pid that calls again is no longer
    /// looked up, only counted.)
    #[cfg(test)]
    fn contains(&self, pid: u32) -> bool {
        match pid >= Self::BITS {
            true => self.above.contains(&pid),
            false => self
                .bits
                .get((pid / 64) as usize)
                .is_some_and(|w| w & (1 << (pid % 64)) != 0),
        }
    }

    /// How many were retired.
    fn len(&self) -> usize {
        self.count
    }

    /// What counts toward [`MAX_CARRIED_ENTRIES`]: the pids outside the
    /// bitmap (the bitmap is bounded by the pid space).
    fn held_entries(&self) -> usize {
        self.above.len()
    }
}

/// `meta.run_ledger` once the table is complete.
const COMPLETE: &str = "1";
const TABLE: &str = "run_ledger";
const CREATE: &str =
    "CREATE TABLE IF NOT EXISTS run_ledger(pid INTEGER NOT NULL, ledger TEXT NOT NULL)";

/// The run's ledger state when a file began (see [`store_begin`]).
const BEGIN_TABLE: &str = "run_ledger_begin";
const BEGIN_CREATE: &str = "CREATE TABLE IF NOT EXISTS run_ledger_begin(pid INTEGER NOT NULL, state TEXT NOT NULL, sites TEXT NOT NULL)";
const BEGIN_COLS: &[&str] = &["pid", "state", "sites"];

/// The final states of the processes retired at their exit in this file
/// (see [`store_exited`]); the columns of [`BEGIN_TABLE`].
const EXITED_TABLE: &str = "run_ledger_exited";
const EXITED_CREATE: &str = "CREATE TABLE IF NOT EXISTS run_ledger_exited(pid INTEGER NOT NULL, state TEXT NOT NULL, sites TEXT NOT NULL)";

/// The link of one file of a rotating trace to the run's carried ledger:
/// the run's identity, this file's number and the state shared by the
/// run's completions (one at a time, in file order: `trace --rotate`).
#[derive(Clone)]
pub struct RunLink {
    run_id: Arc<str>,
    file: u64,
    state: Arc<Mutex<CarryState>>,
}

impl std::fmt::Debug for RunLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunLink(run {}, file {})", self.run_id, self.file)
    }
}

impl PartialEq for RunLink {
    fn eq(&self, o: &RunLink) -> bool {
        Arc::ptr_eq(&self.state, &o.state) && self.file == o.file
    }
}
impl Eq for RunLink {}

impl RunLink {
    /// A new run (a fresh random id), for its file 1.
    pub fn new_run() -> RunLink {
        RunLink {
            run_id: random_id().into(),
            file: 1,
            state: Arc::new(Mutex::new(CarryState::Start)),
        }
    }

    /// File `n` of run `run_id` (a new id when None: no finished file of
    /// the run names it), for completing files their tracer left
    /// unfinished (`gpusleuth finish`): the ledger that tracer carried is
    /// gone with it, so file `n` starts a new chain (why: `why`, noted in
    /// the file; file 1 starts the run's), and files finished after it
    /// through [`Self::for_file`] continue that chain.
    pub fn for_unfinished(run_id: Option<&str>, n: u64, why: &str) -> RunLink {
        let state = match n {
            1 => CarryState::Start,
            _ => CarryState::Broken(why.to_string()),
        };
        RunLink {
            run_id: run_id.map_or_else(|| random_id().into(), Into::into),
            file: n,
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// The same run, for its file `n`.
    pub fn for_file(&self, n: u64) -> RunLink {
        RunLink {
            file: n,
            ..self.clone()
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Takes the state the previous completion left, leaving "broken" in
    /// its place until [`Self::settle`] after this completion's commit.
    fn take(&self) -> CarryState {
        let broken = CarryState::Broken(format!(
            "the completion of file {} did not finish",
            self.file
        ));
        // A completion that panicked poisoned the lock: its state is broken.
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *g, broken)
    }

    /// What this file's completion leaves to the next one, once committed.
    pub(crate) fn settle(&self, next: CarryState) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *g = next;
    }
}

/// 128 random bits as hex (the kernel's generator; the time and pid if it
/// cannot be read): two runs never share an id, so a file of another run
/// copied into a run directory does not continue its chain.
fn random_id() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the completions of a run pass on.
pub(crate) enum CarryState {
    /// No file completed yet.
    Start,
    Carried(Box<Carried>),
    /// Why the next file starts a new chain.
    Broken(String),
}

/// The run's ledger at the end of file `last`, carried to file `last + 1`.
pub(crate) struct Carried {
    from: u64,
    last: u64,
    builder: LedgerBuilder,
    /// The stacks of the sites the run's ledger names (by id).
    stacks: BTreeMap<u64, Stack>,
    /// The host ranges pinned at the end of file `last` (`run_pinned`).
    pinned: PinnedState,
    /// The run's device allocations per site, per process (the per-site
    /// table's counts), stored with the builder at each file's start.
    tally: BTreeMap<u32, SiteTally>,
    /// The run's allocator views (`run_allocator`).
    allocator: crate::run_allocator::AllocatorCarry,
    /// Processes retired from the builder on this chain: one that makes a
    /// call again (a reused pid, or a call reported after the exit) starts
    /// a new chain, so no process is answered from two pieces.
    retired: RetiredPids,
}

impl Carried {
    /// A new chain starting at file `from`.
    fn fresh(from: u64) -> Carried {
        Carried {
            from,
            last: 0,
            // Sites at the peak too: a file's stored start state
            // answers `memory --by-site --at`.
            builder: LedgerBuilder::new(None).with_peak_sites(),
            stacks: BTreeMap::new(),
            pinned: PinnedState::default(),
            tally: BTreeMap::new(),
            allocator: Default::default(),
            retired: RetiredPids::default(),
        }
    }

    /// The host ranges live when this file began, over its chain.
    pub(crate) fn pinned(&self) -> &PinnedState {
        &self.pinned
    }

    /// Whether the chain starts at the run's file 1: then what it carries
    /// is the whole run's (files `--keep` deleted included).
    pub(crate) fn covers_whole_run(&self) -> bool {
        self.from == 1
    }
}

/// The state the previous completion of the run of `link` left for this
/// file (taken: "broken" until [`RunLink::settle`]); a new chain from
/// this file when there is none to continue, with a note saying why
/// (unless this is the run's first file).
pub(crate) fn begin(conn: &Connection, link: &RunLink) -> rusqlite::Result<Carried> {
    Ok(match link.take() {
        CarryState::Carried(c) if c.last.checked_add(1) == Some(link.file) => *c,
        other => {
            let why = match other {
                CarryState::Start if link.file == 1 => None,
                CarryState::Start => Some("no earlier file of this run was completed".to_string()),
                CarryState::Broken(why) => Some(why),
                CarryState::Carried(c) => Some(format!("the last file carried is file {}", c.last)),
            };
            if let Some(why) = why {
                note_new_chain(conn, link.file, &why)?;
            }
            Carried::fresh(link.file)
        }
    })
}

/// The note of a file that starts a new chain of the run's ledger, and why.
fn note_new_chain(conn: &Connection, file: u64, why: &str) -> rusqlite::Result<()> {
    let text = format!(
        "run ledger: file {file} starts a new chain ({why}); `explain --db DIR` replays the memory calls of a run read across it"
    );
    crate::writer::insert_note(
        conn,
        crate::file_clock::now_on_file_clock(conn)?,
        crate::NoteLevel::Info.as_str(),
        &text,
    )
}

/// The processes of the carried ledger among those that exited in this
/// file (`exited`: no call of theirs ended after their exit, as the file's
/// own ledger found them), to be retired once their final ledger is
/// stored (round 47): a process that exited keeps nothing live
/// in the GPU, so a node agent that sees short-lived processes come and go
/// carries only those alive (before, every process the run had seen, and
/// the chain stopped after ~1,900 of them). A process whose allocator
/// views are carried (`run_allocator`) is retired from them too, once this
/// file stored its views (readers take them from this file:
/// `RunLean::carried_views`).
fn exited_here(exited: Vec<u32>, c: &Carried) -> Vec<u32> {
    exited
        .into_iter()
        .filter(|&pid| c.builder.holds(pid))
        .collect()
}

/// Stores the final replay state and per-site tally of each process of
/// `exited` (`run_ledger_exited(pid, state, sites)`, the shape of
/// `run_ledger_begin`), for `memory --at` and windows of the run in later
/// files ([`begin_state_over`]; their states are read only on a chain from
/// file 1), and for readers of the run's allocator views the list of the
/// processes whose last file this is ([`exited_pids`]); returns the stack
/// ids the states name.
fn store_exited(conn: &Connection, c: &Carried, exited: &[u32]) -> rusqlite::Result<BTreeSet<u64>> {
    conn.execute_batch(EXITED_CREATE)?;
    conn.execute(&format!("DELETE FROM {EXITED_TABLE}"), [])?;
    let mut named = BTreeSet::new();
    for state in exited.iter().filter_map(|&pid| c.builder.state_of(pid)) {
        named.extend(store_state_row(conn, EXITED_TABLE, c, &state)?);
    }
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('run_ledger_exited', ?1)",
        [COMPLETE],
    )?;
    Ok(named)
}

/// The file's own ledger (`ledger_rollup`) and, for a file of a rotating
/// trace (`run`: its link and the state [`begin`] took, with the host
/// ranges live at the file's end and the file's processes with allocator
/// events), the run's ledger up to its end with its links, and the run's
/// allocator views (`run_allocator`). The file's own ledgers (with each process's sites at its peak)
/// are handed to `with_own` as soon as they are stored, and dropped before
/// the run's are listed; returns what to [`RunLink::settle`] after the
/// commit. Each memory call of the replay is also handed to `also` (with
/// its row id).
pub(crate) fn write(
    conn: &Connection,
    run: Option<(&RunLink, Carried, PinnedState, &[u32])>,
    also: impl FnMut(&CallEvent, i64),
    with_own: impl FnOnce(crate::ledger_rollup::Written) -> rusqlite::Result<()>,
) -> rusqlite::Result<Option<CarryState>> {
    let listed = crate::ledger_rollup::listed_pids(conn)?;
    let Some((link, mut c, pinned_at_end, allocator_pids)) = run else {
        with_own(crate::ledger_rollup::write(conn, &listed, None, also)?)?;
        return Ok(None);
    };
    // A retired pid that calls again is another process (a reused pid):
    // the builder forgot the first at its exit, so the second starts
    // afresh and the chain goes on. Before round 53 the chain restarted
    // here, and once `--keep` deleted the files before the restart, what
    // every other process had allocated in them was lost without a word
    // (pid reuse is routine on a node up for days: round 53's tester).
    let mut named = match c.covers_whole_run() {
        true => store_begin(conn, &c)?,
        false => BTreeSet::new(),
    };
    let mut tally = std::mem::take(&mut c.tally);
    let mut allocator = std::mem::take(&mut c.allocator);
    let mut also = also;
    let mut own = crate::ledger_rollup::write(conn, &listed, Some(&mut c.builder), |call, id| {
        tally.entry(call.pid).or_default().add(call, id);
        allocator.saw(call);
        also(call, id);
    })?;
    c.tally = tally;
    let exited = exited_here(std::mem::take(&mut own.exited), &c);
    // The file's own ledgers are used and dropped before the run's are
    // listed: each lists the live allocations (88 bytes each), and holding
    // both at once was the completion's peak (docs/benchmarks.md).
    with_own(own)?;
    let run = c.builder.bare_ledgers();
    // The run's allocator views up to this file's end, their reserved
    // bytes the run's ledger's.
    allocator.write(conn, &run, allocator_pids)?;
    c.allocator = allocator;
    named.extend(store_exited(conn, &c, &exited)?);
    c.stacks = copy_stacks(conn, &run, named, std::mem::take(&mut c.stacks))?;
    conn.execute_batch(CREATE)?;
    conn.execute("DELETE FROM run_ledger", [])?;
    crate::ledger_rollup::store(conn, TABLE, &run)?;
    c.pinned = pinned_at_end;
    crate::run_pinned::store(conn, &c.pinned)?;
    let mut meta = conn.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)")?;
    meta.execute(["run_id", link.run_id()])?;
    meta.execute(["run_file", &link.file.to_string()])?;
    meta.execute(["run_ledger_from", &c.from.to_string()])?;
    meta.execute(["run_ledger", COMPLETE])?;
    // Their final ledgers are this file's rows: retired now.
    for pid in exited {
        c.builder.forget(pid);
        c.tally.remove(&pid);
        c.allocator.retire(pid);
        c.retired.insert(pid);
    }
    meta.execute(["run_ledger_retired", &c.retired.len().to_string()])?;
    c.last = link.file;
    let tallied: usize = c.tally.values().map(SiteTally::len).sum();
    let held = c.builder.held_entries() + c.pinned.range_count() + c.retired.held_entries();
    let processes = c.builder.process_count();
    let next = if held + tallied + processes * PROCESS_ENTRIES > MAX_CARRIED_ENTRIES {
        CarryState::Broken(format!(
            "the run's ledger held more than {MAX_CARRIED_ENTRIES} live allocations, failed allocations, sizes, threads and pinned host ranges, with its {processes} processes counted as {PROCESS_ENTRIES} each, at the end of file {}: not carried further",
            link.file
        ))
    } else {
        CarryState::Carried(Box::new(c))
    };
    Ok(Some(next))
}

/// Stores the run's ledger state and per-site tallies as they were when
/// this file began (`run_ledger_begin`, `meta.run_ledger_begin`, and
/// `meta.run_ledger_begin_until`: the latest return time applied), for
/// `memory --at` of the run to replay this file alone; returns the stack
/// ids the state names (their stacks must be in this file).
fn store_begin(conn: &Connection, c: &Carried) -> rusqlite::Result<BTreeSet<u64>> {
    conn.execute_batch(BEGIN_CREATE)?;
    conn.execute(&format!("DELETE FROM {BEGIN_TABLE}"), [])?;
    let mut named = BTreeSet::new();
    for state in c.builder.each_state() {
        named.extend(store_state_row(conn, BEGIN_TABLE, c, &state)?);
    }
    let mut meta = conn.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)")?;
    match c.builder.last_applied_end_ns() {
        Some(t) => meta.execute(["run_ledger_begin_until", &t.to_string()])?,
        None => meta.execute(["run_ledger_begin_until", "none"])?,
    };
    meta.execute(["run_ledger_begin", COMPLETE])?;
    Ok(named)
}

/// Inserts one process's replay state and its per-site tally into `table`
/// (`run_ledger_begin` or `run_ledger_exited`); returns the stack ids they name.
fn store_state_row(
    conn: &Connection,
    table: &str,
    c: &Carried,
    state: &ProcessState,
) -> rusqlite::Result<Vec<u64>> {
    let sites = c
        .tally
        .get(&state.pid)
        .map(SiteTally::entries)
        .unwrap_or_default();
    let mut named: Vec<u64> = state.stack_ids().collect();
    named.extend(sites.iter().filter_map(|e| e.0));
    let (state_json, sites_json) = (json(state), json(&sites));
    insert_row(
        conn,
        table,
        BEGIN_COLS,
        &[
            Col::Int(state.pid.into()),
            Col::Json(&state_json),
            Col::Json(&sites_json),
        ],
    )?;
    Ok(named)
}

/// Stores in the file the stacks of every site `run` or `also` names that
/// it lacks (from `carried`), and returns those stacks, read from the file
/// or carried, for the next file.
fn copy_stacks(
    conn: &Connection,
    run: &[ProcessLedger],
    also: BTreeSet<u64>,
    mut carried: BTreeMap<u64, Stack>,
) -> rusqlite::Result<BTreeMap<u64, Stack>> {
    let mut named: BTreeSet<u64> = run
        .iter()
        .flat_map(|l| {
            let unfreed = l.unfreed.iter().filter_map(|u| u.stack_id);
            unfreed.chain(l.failed_allocs.iter().filter_map(|f| f.stack_id))
        })
        .collect();
    named.extend(also);
    if named.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut own = crate::stacks::read_all(conn, None)?;
    let mut out = BTreeMap::new();
    for id in named {
        if let Some(s) = own.remove(&id) {
            out.insert(id, s);
        } else if let Some(s) = carried.remove(&id) {
            crate::stacks::insert(conn, &s)?;
            out.insert(id, s);
        }
        // Neither: the stack never reached a file (`LOST`), as in a replay.
    }
    Ok(out)
}

/// The id of the run a finished file belongs to (`meta.run_id`), None for
/// a file without a link (see [`link`]).
pub fn run_id_of(trace: &Trace) -> Result<Option<String>, StoreError> {
    Ok(link(trace)?.map(|l| l.run_id))
}

/// One file's link to a run's carried ledger, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    run_id: String,
    file: u64,
    from: u64,
}

impl Link {
    /// The file's number in its run (1 for the first).
    pub(crate) fn file(&self) -> u64 {
        self.file
    }
}

/// The link of a finished file; None when it has none (a file of an older
/// gpusleuth, of a trace without `--rotate`, or a value that is not one a
/// tracer writes: then readers replay).
pub(crate) fn link(trace: &Trace) -> Result<Option<Link>, StoreError> {
    let conn = trace.keyed();
    let get = |k| crate::open::meta_value(conn, k).map_err(|e| trace.read_error(e));
    if get("run_ledger")?.as_deref() != Some(COMPLETE) {
        return Ok(None);
    }
    let number = |v: Option<String>| {
        v.and_then(|s| s.parse::<u64>().ok())
            .filter(|&n| n >= 1 && n <= crate::problems::MAX_NS as u64)
    };
    let run_id = get("run_id")?
        .filter(|s| (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit()));
    Ok(
        match (
            run_id,
            number(get("run_file")?),
            number(get("run_ledger_from")?),
        ) {
            (Some(run_id), Some(file), Some(from)) if from <= file => {
                Some(Link { run_id, file, from })
            }
            _ => None,
        },
    )
}

/// Whether file `n`, whose link is `next` (None: not finished yet, the
/// file the tracer is writing), began where `prev` (file `n - 1`'s link)
/// ended, on a chain that starts at the run's file 1: then `n - 1`'s
/// stored end state (`run_pinned`) is `n`'s start, over the whole run.
pub(crate) fn continues_from_start(prev: &Link, next: Option<&Link>, n: u64) -> bool {
    let prev_ok = prev.from == 1 && prev.file.checked_add(1) == Some(n);
    prev_ok && next.is_none_or(|l| l.file == n && l.run_id == prev.run_id && l.from == prev.from)
}

/// Whether the run ledger of the last of a run's files answers for them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Chain {
    /// It does; `pruned` files before the first one read are covered too
    /// (deleted by `--keep`, or otherwise gone).
    Intact { pruned: u64 },
    /// It does not: why (the readers replay and say so).
    Broken(String),
}

/// Judges the links of the finished files read (`files`: number from the
/// name and link, oldest first).
pub(crate) fn judge(files: &[(u64, Option<Link>)]) -> Chain {
    let (last_n, last) = match files.last() {
        Some((n, Some(l))) => (n, l),
        Some((n, None)) => {
            return Chain::Broken(format!(
                "{} carries no run ledger (an older gpusleuth, or a file not written by `trace --rotate`)",
                crate::run::part_name(*n)
            ))
        }
        None => return Chain::Broken("no file".into()),
    };
    let mut expected = None;
    for (n, l) in files {
        let name = crate::run::part_name(*n);
        let Some(l) = l else {
            return Chain::Broken(format!("{name} carries no run ledger (an older gpusleuth, or a file not written by `trace --rotate`)"));
        };
        if l.file != *n {
            return Chain::Broken(format!("{name} says it is file {} of its run", l.file));
        }
        if l.run_id != last.run_id {
            return Chain::Broken(format!("{name} is a file of another run"));
        }
        if l.from != last.from {
            return Chain::Broken(format!(
                "the run's ledger restarts between {name} and file {last_n} (a file's completion did not carry it)"
            ));
        }
        if expected.is_some_and(|e| e != *n) {
            return Chain::Broken(format!("files before {name} are missing or unfinished"));
        }
        expected = n.checked_add(1);
    }
    let first = files[0].0;
    if last.from > first {
        // Unreachable with the checks above (every file's `from` ≤ its number).
        return Chain::Broken(format!("the run's ledger starts at file {}", last.from));
    }
    Chain::Intact {
        pruned: first - last.from,
    }
}

/// What a file stored of the run's ledger when it began ([`store_begin`]).
pub(crate) struct Begin {
    /// The replay state of the processes asked for.
    pub(crate) states: Vec<ProcessState>,
    /// Their device allocations per site over the files before.
    pub(crate) tally: SiteTally,
    /// The latest return time in the state (None: no call applied).
    pub(crate) until: Option<u64>,
}

/// Longest stored state or tally of one process: a tracer's bound
/// (`MAX_CARRIED_ENTRIES`, tens of bytes each) is far below it.
const MAX_BEGIN_TEXT: usize = 64 << 20;

/// Whether the file says it stored the run's state as it began
/// (`meta.run_ledger_begin`): a meta value only; [`begin_state`] reads and
/// checks the state.
pub(crate) fn stores_begin_state(trace: &Trace) -> Result<bool, StoreError> {
    let v = crate::open::meta_value(trace.keyed(), "run_ledger_begin")
        .map_err(|e| trace.read_error(e))?;
    Ok(v.as_deref() == Some(COMPLETE))
}

/// The run's ledger as `last` began, of process `pid` (all when None),
/// over the whole run: `earlier` opens the files of its intact chain read
/// before it, newest first (each file, whether or not it holds `pid`: a
/// process may exit in a file without a call there). The last file's
/// stored state holds every process the carried ledger held then; a
/// process retired at its exit before it began (round 47) has its final
/// state in the `run_ledger_exited` of the file it exited in, so those of
/// the earlier files are read too, each process from the latest file that
/// holds it, while a file says some process was retired. None when a file stored no
/// such state (an older gpusleuth, a file that is not part of a `--rotate`
/// run) or its chain does not start at the run's file 1; an error naming
/// `run_ledger_begin` for a table, a meta value or a state no tracer writes.
/// Processes that exited in files no longer read (deleted by `--keep`)
/// are not in it: they held nothing by then.
pub(crate) fn begin_state_over(
    last: &Trace,
    earlier: impl Iterator<Item = Result<Trace, StoreError>>,
    pid: Option<u32>,
) -> Result<Option<Begin>, StoreError> {
    let mut begin = Begin {
        states: Vec::new(),
        tally: SiteTally::default(),
        until: None,
    };
    let mut seen = BTreeSet::new();
    let Some(until) = begin_meta(last)? else {
        return Ok(None);
    };
    begin.until = until;
    read_state_rows(last, BEGIN_TABLE, pid, &mut seen, &mut begin)?;
    // The processes retired before it began: each one's final state in
    // the file it exited in, newest first, until a file before which none
    // was retired (`meta.run_ledger_retired`, counted over the chain).
    for trace in earlier {
        let trace = trace?;
        if begin_meta(&trace)?.is_none() {
            return Ok(None);
        }
        if !retired_any(&trace)? {
            break;
        }
        read_state_rows(&trace, EXITED_TABLE, pid, &mut seen, &mut begin)?;
    }
    Ok(Some(begin))
}

/// Whether the carried ledger had retired a process at its exit by the end
/// of `trace` (`meta.run_ledger_retired`, the count; absent in files of
/// tracers that never retired one): then a reader looks for a process
/// missing from its rows in the earlier files.
pub(crate) fn retired_any(trace: &Trace) -> Result<bool, StoreError> {
    let v = crate::open::meta_value(trace.keyed(), "run_ledger_retired")
        .map_err(|e| trace.read_error(e))?;
    Ok(v.is_some_and(|v| v != "0"))
}

/// The processes retired at their exit in `trace` (`run_ledger_exited`'s
/// pids; empty in a file of a tracer that retired none, or when
/// `meta.run_ledger_exited` is not 1): their views and ledgers there are
/// their last. An error naming the table for one no tracer writes.
pub(crate) fn exited_pids(trace: &Trace) -> Result<BTreeSet<u32>, StoreError> {
    stored_pids(trace, "run_ledger_exited", (EXITED_TABLE, BEGIN_COLS), None)
}

/// The processes `trace`'s carried run ledger lists (`pid` alone, or
/// all): those the run held memory for by this file's end, and those that
/// exited in it; empty where it stores none. A process that made no call
/// in the files read (an idle server holding what it allocated in files
/// `--keep` deleted) is known to the readers only from here (round 53's
/// tester: "No traced process made CUDA calls" over a run whose last file
/// carried 95 MiB of it). An error naming the table for one no tracer writes.
pub(crate) fn listed_pids(trace: &Trace, pid: Option<u32>) -> Result<BTreeSet<u32>, StoreError> {
    stored_pids(
        trace,
        "run_ledger",
        (TABLE, crate::ledger_rollup::COLS),
        pid,
    )
}

/// The pids of table `table` (of columns `cols`; `pid` alone, or all),
/// empty unless `meta.{meta_key}` says it is complete.
pub(crate) fn stored_pids(
    trace: &Trace,
    meta_key: &str,
    (table, cols): (&str, &[&str]),
    pid: Option<u32>,
) -> Result<BTreeSet<u32>, StoreError> {
    let conn = trace.keyed();
    let read = || -> rusqlite::Result<BTreeSet<u32>> {
        if !complete_tables(conn, meta_key, &[(table, cols)])? {
            return Ok(BTreeSet::new());
        }
        let mut st = conn.prepare(&format!("SELECT pid FROM {table}"))?;
        let mut rows = st.query([])?;
        let mut out = BTreeSet::new();
        while let Some(r) = rows.next()? {
            let p = u32::try_from(r.get::<_, i64>(0)?)
                .map_err(|_| damaged_table(table, "holds a pid outside 0..2^32"))?;
            if pid.is_none_or(|only| only == p) {
                out.insert(p);
            }
        }
        Ok(out)
    };
    read().map_err(|e| trace.read_error(e))
}

/// Whether `trace` stored the run's state as it began on a chain from the
/// run's file 1 (None when not), and the latest return time in it (its
/// `meta.run_ledger_begin_until`; an error for a value no tracer writes).
fn begin_meta(trace: &Trace) -> Result<Option<Option<u64>>, StoreError> {
    let conn = trace.keyed();
    let get = |k| crate::open::meta_value(conn, k).map_err(|e| trace.read_error(e));
    if get("run_ledger_begin")?.as_deref() != Some(COMPLETE) {
        return Ok(None);
    }
    if link(trace)?.is_none_or(|l| l.from != 1) {
        return Ok(None);
    }
    let bad = |what: &str| trace.read_error(damaged_table(BEGIN_TABLE, what));
    let until = match get("run_ledger_begin_until")?.as_deref() {
        Some("none") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .ok()
                .filter(|&t| t <= crate::problems::MAX_NS as u64)
                .ok_or_else(|| bad("has a meta.run_ledger_begin_until no tracer writes"))?,
        ),
        None => return Err(bad("has no meta.run_ledger_begin_until")),
    };
    Ok(Some(until))
}

/// Adds to `into` the states stored in `table` of `trace`
/// (`run_ledger_begin` or `run_ledger_exited`) of process `pid` (all when
/// None) not in `seen` (read from a later file), and marks them seen.
fn read_state_rows(
    trace: &Trace,
    table: &str,
    pid: Option<u32>,
    seen: &mut BTreeSet<u32>,
    into: &mut Begin,
) -> Result<(), StoreError> {
    let conn = trace.keyed();
    let mut read = || -> rusqlite::Result<()> {
        let bad = |what: String| damaged_table(table, &what);
        let (key, says) = match table == BEGIN_TABLE {
            true => (
                "run_ledger_begin",
                "meta.run_ledger_begin says it is complete",
            ),
            false => (
                "run_ledger_exited",
                "meta.run_ledger_retired counts retired processes",
            ),
        };
        if !complete_tables(conn, key, &[(table, BEGIN_COLS)])? {
            return Err(bad(format!("is missing though {says}")));
        }
        // The pids first: a row is read whole only when it is taken.
        let mut st = conn.prepare(&format!("SELECT rowid, pid FROM {table}"))?;
        let mut rows = st.query([])?;
        let (mut in_file, mut wanted) = (BTreeSet::new(), Vec::new());
        while let Some(r) = rows.next()? {
            let row_pid = u32::try_from(r.get::<_, i64>(1)?)
                .map_err(|_| bad("holds a pid outside 0..2^32".into()))?;
            if !in_file.insert(row_pid) {
                return Err(bad(format!("holds a second row for pid {row_pid}")));
            }
            if pid.is_none_or(|p| p == row_pid) && !seen.contains(&row_pid) {
                wanted.push((r.get::<_, i64>(0)?, row_pid));
            }
        }
        let mut st = conn.prepare(&format!(
            "SELECT state, sites FROM {table} WHERE rowid = ?1"
        ))?;
        let mut entries = 0usize;
        for (rowid, row_pid) in wanted {
            let mut rows = st.query([rowid])?;
            let Some(r) = rows.next()? else { continue };
            let text = |i: usize| -> rusqlite::Result<&str> {
                let t =
                    text_of(r.get_ref(i)?).map_err(|e| bad(format!("of pid {row_pid}: {e}")))?;
                match t.len() > MAX_BEGIN_TEXT {
                    true => Err(bad(format!(
                        "holds a row of pid {row_pid} longer than any tracer writes"
                    ))),
                    false => Ok(t),
                }
            };
            let state: ProcessState = serde_json::from_str(text(0)?)
                .map_err(|e| bad(format!("of pid {row_pid}: {e}")))?;
            let sites: Vec<crate::stream::TallyEntry> = serde_json::from_str(text(1)?)
                .map_err(|e| bad(format!("of pid {row_pid}: {e}")))?;
            if state.pid != row_pid {
                return Err(bad(format!("holds a foreign row for pid {row_pid}")));
            }
            // Taken up with the last file's states, whose errors name that
            // file: checked here, where it was read.
            if table == EXITED_TABLE {
                LedgerBuilder::check_state(&state).map_err(bad)?;
            }
            entries = entries.saturating_add(state.entries() + sites.len());
            if entries > 2 * MAX_CARRIED_ENTRIES {
                return Err(bad("holds more entries than a tracer carries".into()));
            }
            into.tally
                .add_entries(sites)
                .map_err(|e| bad(format!("of pid {row_pid}: {e}")))?;
            into.states.push(state);
            seen.insert(row_pid);
        }
        Ok(())
    };
    read().map_err(|e| trace.read_error(e))
}

/// The run's ledgers of `pids` stored by an intact chain whose files read
/// are `files` (oldest first), opened by `open`, in `context`: each
/// process's row in the last file, or, for a process the carried ledger
/// retired at its exit (round 47), its final row in the latest earlier
/// file holding it (the file it exited in). None when a pid has no row in
/// any of them (then the replay answers); an error when a table is not
/// the one gpusleuth writes or a ledger is damaged.
pub(crate) fn stored_over(
    files: &[std::path::PathBuf],
    mut open: impl FnMut(&std::path::Path) -> Result<Trace, StoreError>,
    pids: &BTreeSet<u32>,
    context: &TraceData,
) -> Result<Option<Vec<ProcessLedger>>, StoreError> {
    let mut missing = pids.clone();
    let mut found = BTreeMap::new();
    let mut walk = true;
    for path in files.iter().rev() {
        if missing.is_empty() || !walk {
            break;
        }
        let trace = open(path)?;
        // No process retired on the chain by this file's end: its rows
        // hold every process of the files up to it.
        walk = retired_any(&trace)?;
        let conn = trace.keyed();
        let read = || -> rusqlite::Result<BTreeMap<u32, ProcessLedger>> {
            if !complete_tables(conn, "run_ledger", &[(TABLE, crate::ledger_rollup::COLS)])? {
                return Err(damaged_table(
                    TABLE,
                    "is missing though meta.run_ledger says it is complete",
                ));
            }
            crate::ledger_rollup::read(conn, TABLE, &missing, context)
        };
        let rows = read().map_err(|e| trace.read_error(e))?;
        for (pid, l) in rows {
            missing.remove(&pid);
            found.insert(pid, l);
        }
    }
    Ok(missing.is_empty().then(|| found.into_values().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(run: &str, file: u64, from: u64) -> Option<Link> {
        Some(Link {
            run_id: run.into(),
            file,
            from,
        })
    }

    #[test]
    fn a_chain_is_intact_only_over_consecutive_files_of_one_run_and_chain() {
        assert_eq!(
            judge(&[(1, l("ab", 1, 1)), (2, l("ab", 2, 1)), (3, l("ab", 3, 1))]),
            Chain::Intact { pruned: 0 }
        );
        assert_eq!(
            judge(&[(4, l("ab", 4, 1)), (5, l("ab", 5, 1))]),
            Chain::Intact { pruned: 3 }
        );
        let broken = |files: &[(u64, Option<Link>)], why: &str| match judge(files) {
            Chain::Broken(w) => assert!(w.contains(why), "{w}"),
            c => panic!("{c:?} for {files:?}"),
        };
        broken(&[(1, None), (2, l("ab", 2, 1))], "carries no run ledger");
        broken(&[(1, l("ab", 1, 1)), (2, None)], "carries no run ledger");
        broken(&[(1, l("ab", 1, 1)), (3, l("ab", 3, 1))], "missing");
        broken(&[(1, l("cd", 1, 1)), (2, l("ab", 2, 1))], "another run");
        broken(&[(1, l("ab", 1, 1)), (2, l("ab", 2, 2))], "restarts");
        broken(
            &[(1, l("ab", 1, 1)), (2, l("ab", 7, 1))],
            "says it is file 7",
        );
        // A restarted chain that the files read all share but that starts
        // after the first of them.
        broken(
            &[(1, l("ab", 1, 2)), (2, l("ab", 2, 2))],
            "starts at file 2",
        );
        broken(&[], "no file");
    }

    #[test]
    fn retired_pids_are_one_bit_each_in_the_pid_space_and_counted_once() {
        let mut r = RetiredPids::default();
        assert!(!r.contains(0) && !r.contains(u32::MAX));
        let bound = RetiredPids::BITS;
        for pid in [0, 1, 63, 64, 4_194_303, 300, 300, bound, u32::MAX, bound] {
            r.insert(pid);
        }
        assert_eq!(r.len(), 8);
        for pid in [0, 1, 63, 64, 4_194_303, 300, bound, u32::MAX] {
            assert!(r.contains(pid), "{pid}");
        }
        for pid in [2, 62, 65, 299, 301, 4_194_302, bound + 1, u32::MAX - 1] {
            assert!(!r.contains(pid), "{pid}");
        }
        // The bitmap: at most 2^22 bits; only pids past it count entries.
        assert_eq!(r.bits.len(), (bound / 64) as usize);
        assert_eq!(r.held_entries(), 2);
    }

    #[test]
    fn run_ids_are_random_hex() {
        let (a, b) = (random_id(), random_id());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
