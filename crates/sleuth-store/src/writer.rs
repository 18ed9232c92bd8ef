//! The write side: a writer thread fed through a bounded channel, one
//! transaction per batch, a size cap, and `finish` to complete the trace.
//!
//! Durability: WAL with `synchronous=NORMAL`. A committed batch survives a
//! SIGKILL of the process (the WAL is replayed on next open); a power loss
//! may lose the last batches but never corrupts the file.

use crate::error::{SqlContext, StoreError};
use crate::file_clock;
use crate::finalize;
use crate::schema;
use crate::types::{LibraryInfo, NoteLevel, SessionInfo, WriteSummary, WriterOptions};
use rusqlite::{params, CachedStatement, Connection, OpenFlags, Transaction};
use sleuth_core::record::stat;
use sleuth_core::rollup::ThreadWindows;
use sleuth_core::{CallEvent, Event, OpCount, ProcEvent, ProcessInfo, WaitEvent};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest time events wait in a batch before it is committed.
const BATCH_WINDOW: Duration = Duration::from_millis(100);

/// Messages to the writer thread.
enum Msg {
    Event(Event),
    /// Events in capture order: one message (one channel hand-off, one
    /// clock read) for a whole poll's worth.
    Events(Vec<Event>),
    Process(ProcessInfo),
    Library(LibraryInfo),
    Note(NoteLevel, String),
    Stat(String, u64),
    OpCounts(Vec<OpCount>),
    /// Running counts of the kernel-counted ops, as this file counts them.
    CountSamples(Vec<sleuth_core::counted::CountSample>),
    SessionEnd(u64),
    /// A resolved call site (stored once per id).
    Stack(Box<sleuth_core::sites::Stack>),
    GpuSamples(Vec<sleuth_core::GpuSample>),
    ProcessGpuSamples(Vec<sleuth_core::ProcessGpuSample>),
    /// Commit what was sent before, then answer with the number of events committed so far.
    Flush(SyncSender<u64>),
    /// Commit, complete the trace, and stop.
    Finish(SyncSender<Result<WriteSummary, String>>),
}

/// Owns the writer thread of one trace database.
pub struct TraceWriter {
    handle: WriterHandle,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// A cloneable way to feed the writer from any thread.
#[derive(Clone)]
pub struct WriterHandle {
    tx: SyncSender<Msg>,
}

impl TraceWriter {
    /// Creates a new trace database (mode 0600) and starts its writer thread.
    pub fn create(
        path: &Path,
        info: SessionInfo,
        opts: WriterOptions,
    ) -> Result<TraceWriter, StoreError> {
        let conn = create_initialized(path, &info, &opts)?;
        let (tx, rx) = sync_channel(opts.queue_capacity.max(1));
        let background = opts.background;
        let mut state = WriterState::new(conn, path.to_path_buf(), opts, info.clock_base_ns);
        state.disk = Some(crate::disk_reserve::DiskWatch::start(path));
        let thread = std::thread::Builder::new()
            .name("gpusleuth-db".into())
            .spawn(move || {
                if background {
                    lower_own_priority();
                }
                state.run(rx)
            })
            .map_err(|e| StoreError::io(path, e))?;
        Ok(TraceWriter {
            handle: WriterHandle { tx },
            thread: Some(thread),
            path: path.to_path_buf(),
        })
    }

    pub fn handle(&self) -> WriterHandle {
        self.handle.clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits everything sent so far, fills `call_culprits`, completes
    /// `processes` from lifecycle events, and leaves one self-contained file
    /// (WAL checkpointed and removed). Handles still held elsewhere fail afterwards.
    pub fn finish(mut self) -> Result<WriteSummary, StoreError> {
        let (reply_tx, reply_rx) = sync_channel(1);
        self.handle.send_msg(Msg::Finish(reply_tx))?;
        let result = reply_rx
            .recv()
            .map_err(|_| StoreError::WriterGone("writer thread ended without an answer".into()))?;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        result.map_err(|msg| StoreError::file(&self.path, msg))
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Without finish(): the thread commits what it has when every
        // handle is gone; we do not wait for handles held elsewhere.
        if let Some(t) = self.thread.take() {
            drop(t);
        }
    }
}

impl WriterHandle {
    fn send_msg(&self, m: Msg) -> Result<(), StoreError> {
        self.tx
            .send(m)
            .map_err(|_| StoreError::WriterGone("the trace database is closed".into()))
    }
    /// Queues one event; blocks while the queue is full.
    pub fn send(&self, e: Event) -> Result<(), StoreError> {
        self.send_msg(Msg::Event(e))
    }
    /// Queues events in order as one message (one slot of the queue):
    /// a hot sender's way to pay the channel once per batch, not per event.
    pub fn send_batch(&self, events: Vec<Event>) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        self.send_msg(Msg::Events(events))
    }
    /// Records (or replaces) what is known about a process.
    pub fn set_process(&self, p: ProcessInfo) -> Result<(), StoreError> {
        self.send_msg(Msg::Process(p))
    }
    pub fn add_library(&self, l: LibraryInfo) -> Result<(), StoreError> {
        self.send_msg(Msg::Library(l))
    }
    /// Adds a note stamped with the current monotonic time.
    pub fn add_note(&self, level: NoteLevel, text: impl Into<String>) -> Result<(), StoreError> {
        self.send_msg(Msg::Note(level, text.into()))
    }
    /// Sets a named counter, e.g. `drop_ring_full_call` (see [`drop_stat_name`]).
    /// `events_*` and `drop_db_full` are kept by the writer itself.
    pub fn set_stat(&self, name: impl Into<String>, value: u64) -> Result<(), StoreError> {
        self.send_msg(Msg::Stat(name.into(), value))
    }
    /// Replaces the kernel-counted hot-path counts of the given (pid, op) pairs.
    pub fn set_op_counts(&self, counts: Vec<OpCount>) -> Result<(), StoreError> {
        self.send_msg(Msg::OpCounts(counts))
    }
    /// Running counts of the kernel-counted ops (calls since this file
    /// began), so that a time window can place them
    /// (`sleuth_core::counted`).
    pub fn add_count_samples(
        &self,
        s: Vec<sleuth_core::counted::CountSample>,
    ) -> Result<(), StoreError> {
        self.send_msg(Msg::CountSamples(s))
    }
    /// GPU busy samples (NVML) taken during the trace.
    pub fn add_gpu_samples(&self, s: Vec<sleuth_core::GpuSample>) -> Result<(), StoreError> {
        self.send_msg(Msg::GpuSamples(s))
    }
    /// Per-process driver samples (memory held, SM use) taken during the trace.
    pub fn add_process_gpu_samples(
        &self,
        s: Vec<sleuth_core::ProcessGpuSample>,
    ) -> Result<(), StoreError> {
        self.send_msg(Msg::ProcessGpuSamples(s))
    }
    /// Stores a call site; calls and allocator events name it by id.
    /// Send it before the events that name it.
    pub fn add_stack(&self, s: sleuth_core::sites::Stack) -> Result<(), StoreError> {
        self.send_msg(Msg::Stack(Box::new(s)))
    }
    pub fn set_session_end(&self, end_mono_ns: u64) -> Result<(), StoreError> {
        self.send_msg(Msg::SessionEnd(end_mono_ns))
    }
    /// Waits until everything sent before is committed; returns the number
    /// of events (calls, waits, lifecycle) received and committed so far.
    pub fn flush(&self) -> Result<u64, StoreError> {
        let (tx, rx) = sync_channel(1);
        self.send_msg(Msg::Flush(tx))?;
        rx.recv()
            .map_err(|_| StoreError::WriterGone("writer thread stopped".into()))
    }
}

/// Stats name of a kernel counter: `drop_` + `record::stat::NAMES[i]` for a
/// loss, `edge_` + `record::stat::edge_name(i)` for an attach edge, the bare
/// name for a gap the capture settled itself (not a loss). None past the last.
pub fn drop_stat_name(index: usize) -> Option<String> {
    let name = stat::NAMES.get(index)?;
    Some(if stat::is_attach_edge(index) {
        format!("edge_{}", stat::edge_name(index))
    } else if stat::is_settled_gap(index) {
        name.to_string()
    } else {
        format!("drop_{name}")
    })
}

/// CLOCK_MONOTONIC now, in ns (the clock of every trace timestamp).
pub fn monotonic_now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread in ns (exact: the scheduler's runtime).
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Clock `id` now, in ns (0 if the clock fails).
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid, exclusive pointer;
    // both clocks used here exist on every Linux kernel.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Creates the file ourselves so it is 0600 before SQLite ever opens it
/// (SQLite gives the -wal and -shm files the same mode).
pub(crate) fn create_private_file(path: &Path, overwrite: bool) -> Result<(), StoreError> {
    if overwrite {
        remove_trace_files(path)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => crate::outfile::exists_error(path, None),
            _ => StoreError::io(path, e),
        })?;
    Ok(())
}

/// The new trace file at `path`, its schema, session and counters in it,
/// opened for the writer. They are written to a hidden file beside it
/// first, which is then named `path`: a tracer killed while it starts a
/// file (a `--rotate` run's next one) leaves no file without its schema,
/// which every reader of the run refused (round 48), at worst the hidden
/// one.
fn create_initialized(
    path: &Path,
    info: &SessionInfo,
    opts: &WriterOptions,
) -> Result<Connection, StoreError> {
    crate::outfile::ensure_replaceable(path)?;
    if !opts.overwrite && std::fs::symlink_metadata(path).is_ok() {
        return Err(crate::outfile::exists_error(path, None));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let hidden = path.with_file_name(format!(
        ".{}.creating-{}",
        name.unwrap_or_default(),
        std::process::id()
    ));
    // Named by the path asked for: the hidden name is ours, not the user's.
    create_private_file(&hidden, true).map_err(|e| match e {
        StoreError::Io { source, .. } => StoreError::io(path, source),
        other => other,
    })?;
    let open = |p: &Path| {
        Connection::open_with_flags(
            p,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .at(p)
    };
    let written = open(&hidden).and_then(|c| init(&c, info, opts).at(&hidden));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&hidden);
        return Err(e);
    }
    let named = if opts.overwrite {
        remove_trace_files(path)?;
        std::fs::rename(&hidden, path)
    } else {
        // A link fails where the name is taken meanwhile: never replaced.
        // A file system without links gets a rename once the name is seen free.
        match std::fs::hard_link(&hidden, path) {
            Ok(()) => std::fs::remove_file(&hidden),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
            Err(_) if std::fs::symlink_metadata(path).is_ok() => {
                Err(std::io::ErrorKind::AlreadyExists.into())
            }
            Err(_) => std::fs::rename(&hidden, path),
        }
    };
    if let Err(e) = named {
        let _ = std::fs::remove_file(&hidden);
        return Err(match e.kind() {
            std::io::ErrorKind::AlreadyExists => crate::outfile::exists_error(path, None),
            _ => StoreError::io(path, e),
        });
    }
    let conn = open(path)?;
    (|| {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")
    })()
    .at(path)?;
    Ok(conn)
}

/// Removes a trace file and its `-wal`, `-shm` and `-journal`, where present.
fn remove_trace_files(path: &Path) -> Result<(), StoreError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        // A device or a pipe under that name is never removed (as root,
        // `--db /dev/null --force` would have).
        crate::outfile::ensure_replaceable(Path::new(&p))?;
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(path, e)),
        }
    }
    Ok(())
}

/// The schema, the session and the counters, in one transaction (in
/// SQLite's rollback journal: the writer turns on WAL once the file has
/// its name).
fn init(conn: &Connection, info: &SessionInfo, opts: &WriterOptions) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN")?;
    schema::create_deferring_late_indexes(conn, opts.source.as_str(), &info.tool_version)?;
    conn.execute(
        "INSERT INTO session(id, started_unix_ns, start_mono_ns, end_mono_ns, realtime_offset_ns,
            hostname, kernel, command, target, launch_mode, tool_version)
         VALUES (1, ?1, ?2, NULL, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            info.started_unix_ns,
            file_clock::on_file_clock(info.start_mono_ns, info.clock_base_ns) as i64,
            // Wall-clock minus the file's clock: wall-clock times read as before.
            info.realtime_offset_ns
                .saturating_add(info.clock_base_ns as i64),
            info.hostname,
            info.kernel,
            info.command,
            info.target,
            info.launch_mode,
            info.tool_version
        ],
    )?;
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('clock_base_ns', ?1)",
        [info.clock_base_ns.to_string()],
    )?;
    // Every counter exists from the start, so "0 dropped" is stated, not implied.
    let mut st = conn.prepare("INSERT INTO stats(name, value) VALUES (?1, 0)")?;
    for name in [
        "events_call",
        "events_wait",
        "events_proc",
        "drop_db_full",
        "decode_errors",
    ] {
        st.execute([name])?;
    }
    // Every kernel counter under its class's name (losses as `drop_`,
    // attach edges as `edge_`, settled gaps as themselves).
    for name in (0..stat::MAX).filter_map(drop_stat_name) {
        st.execute([name])?;
    }
    st.execute(["edge_call_open_at_end"])?;
    drop(st);
    if let Some(pid) = opts.tracer_pid {
        set_stat(conn, sleuth_core::threads::TRACER_PID_STAT, u64::from(pid))?;
    }
    conn.execute_batch("COMMIT")
}

/// Moves a message's times onto the file's clock, as it arrives: the
/// writer and the file's completion see no other clock.
fn rebase(m: &mut Msg, base: u64) {
    if base == 0 {
        return;
    }
    let at = |t: &mut u64| *t = file_clock::on_file_clock(*t, base);
    match m {
        Msg::Event(e) => file_clock::rebase_event(e, base),
        Msg::Events(evs) => evs
            .iter_mut()
            .for_each(|e| file_clock::rebase_event(e, base)),
        Msg::Process(p) => file_clock::rebase_process(p, base),
        Msg::Library(l) => file_clock::rebase_library(l, base),
        Msg::CountSamples(s) => s.iter_mut().for_each(|c| at(&mut c.ts_ns)),
        Msg::SessionEnd(t) => at(t),
        Msg::GpuSamples(s) => s.iter_mut().for_each(|g| at(&mut g.ts_ns)),
        Msg::ProcessGpuSamples(s) => s.iter_mut().for_each(|g| at(&mut g.ts_ns)),
        // No time in them (a note is stamped when stored, in `apply`).
        Msg::Note(..)
        | Msg::Stat(..)
        | Msg::OpCounts(_)
        | Msg::Stack(_)
        | Msg::Flush(_)
        | Msg::Finish(_) => {}
    }
}

/// Counters the writer keeps itself.
#[derive(Default, Clone)]
struct Counters {
    events_call: u64,
    events_wait: u64,
    events_proc: u64,
    events_block: u64,
    /// Calls and waits past the size cap (`events_*` count them): the
    /// events received are those stored plus these.
    drop_db_full: u64,
    /// Call sites (stacks) past the size cap: not events, so apart from
    /// `drop_db_full` (counted in it before round 51, which then exceeded
    /// the events lost).
    stacks_db_full: u64,
    /// Rows the writer could not store.
    decode_errors: u64,
    /// Records the capture side could not decode (reported through
    /// `set_stat("decode_errors", n)`): added to the writer's own count, never
    /// overwritten by it — `decode_errors` has one owner, this sum.
    decode_errors_upstream: u64,
    calls_stored: u64,
    waits_stored: u64,
    procs_stored: u64,
}

struct WriterState {
    /// The file's clock base (`file_clock`): subtracted from every time
    /// as its message arrives.
    clock_base_ns: u64,
    conn: Connection,
    path: PathBuf,
    opts: WriterOptions,
    n: Counters,
    /// Per-op sums and histograms of the stored calls, written at finish.
    rollup: sleuth_core::rollup::Rollup,
    db_full: bool,
    /// The disk holding the file (`disk_reserve`): where it runs low,
    /// calls and waits are dropped as past the cap (`db_full`) and the
    /// file is completed in the space set aside. None in tests that build
    /// a state by hand.
    disk: Option<crate::disk_reserve::DiskWatch>,
    /// The note saying the disk ran low, stored with the next transaction.
    disk_note: Option<String>,
    /// Events received in the failed transaction and after it (`failed`).
    unstored: u64,
    /// First error; afterwards messages are drained and discarded so senders never block forever.
    failed: Option<String>,
    /// Transactions committed, and this thread's CPU inside their commits
    /// (the WAL writes and checkpoints): `bench` tells it from storing rows.
    batches: u64,
    commit_cpu_ns: u64,
    /// The row id the next stored call gets (`call_blocks`).
    next_call_id: i64,
    /// Each allocator block's base row and the last allocator row's id
    /// (`block_bases`), as of the last committed transaction.
    block_bases: crate::block_bases::BlockBases,
}

impl WriterState {
    fn new(conn: Connection, path: PathBuf, opts: WriterOptions, clock_base_ns: u64) -> Self {
        WriterState {
            clock_base_ns,
            conn,
            path,
            opts,
            n: Counters::default(),
            rollup: Default::default(),
            db_full: false,
            disk: None,
            disk_note: None,
            unstored: 0,
            failed: None,
            batches: 0,
            commit_cpu_ns: 0,
            next_call_id: 1,
            block_bases: Default::default(),
        }
    }

    fn run(&mut self, rx: Receiver<Msg>) {
        loop {
            let Ok(mut first) = rx.recv() else {
                // Every handle dropped without finish(): what was committed stays.
                return;
            };
            rebase(&mut first, self.clock_base_ns);
            let mut events = msg_events(&first);
            let mut batch = vec![first];
            let deadline = Instant::now() + BATCH_WINDOW;
            while !matches!(batch.last(), Some(Msg::Flush(_) | Msg::Finish(_)))
                && events < self.opts.batch_events
            {
                let wait = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(wait) {
                    Ok(mut m) => {
                        rebase(&mut m, self.clock_base_ns);
                        events += msg_events(&m);
                        batch.push(m);
                    }
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
            if self.commit_batch(batch) {
                return;
            }
        }
    }

    /// Applies a batch in one transaction and answers flushes; true when finished.
    fn commit_batch(&mut self, batch: Vec<Msg>) -> bool {
        let mut replies = Vec::new();
        let mut finish = None;
        if self.failed.is_none() {
            // What a failed transaction must not leave counted in memory,
            // where the disk might fill (`DiskWatch::at_risk`).
            let at_risk = !self.db_full && self.disk.as_ref().is_some_and(|d| d.at_risk());
            let before = at_risk.then(|| (self.n.clone(), self.rollup.clone()));
            match self.apply(&batch) {
                Ok(()) => self.watch_disk(),
                Err(e) => match (disk_full(&e), before) {
                    (true, Some(before)) => self.after_disk_filled(&batch, before, &e),
                    _ => self.failed = Some(format!("writing the trace failed: {e}")),
                },
            }
        }
        if self.failed.is_some() {
            // Said with the failure: what the file does not hold.
            self.unstored += batch.iter().map(msg_events).sum::<usize>() as u64;
        }
        for m in batch {
            match m {
                Msg::Flush(r) => replies.push(r),
                Msg::Finish(r) => finish = Some(r),
                _ => {}
            }
        }
        let committed =
            self.n.events_call + self.n.events_wait + self.n.events_proc + self.n.events_block;
        for r in replies {
            let _ = r.send(committed);
        }
        if let Some(r) = finish {
            let result = match self.failed.clone() {
                Some(e) => Err(format!(
                    "{e} ({} events of that write and after it were not stored; the file holds what \
                     was committed before it, and `gpusleuth finish` completes it)",
                    self.unstored
                )),
                None => self
                    .finish_in_reserve()
                    .map_err(|e| format!("completing the trace failed: {e}")),
            };
            // Before the reply: the tracer may exit as soon as it has it.
            if let Some(d) = self.disk.as_mut() {
                d.release();
            }
            let _ = r.send(result);
            return true;
        }
        false
    }

    /// After a commit: where the disk holding the file has run low, the
    /// calls and waits from now on are counted as dropped, not stored (as
    /// past `--max-db`), the space set aside is handed back for the
    /// completion, and a note says so. Looked at between transactions, so
    /// the counters and rollups always match what is stored.
    fn watch_disk(&mut self) {
        let stored = self.n.calls_stored;
        let Some(free) = self.disk.as_mut().and_then(|d| d.ran_low_now(stored)) else {
            return;
        };
        self.fold_wal();
        if self.db_full {
            return; // past the cap already: nothing more is stored anyway
        }
        self.db_full = true;
        self.disk_note = Some(format!(
            "the disk holding the trace ran low ({free} bytes free): later calls and waits are counted in \
             stats.drop_db_full, not stored; the space set aside at the file's start was handed back for its \
             completion"
        ));
    }

    /// The WAL folded into the file and cut to nothing, where the disk ran
    /// low or filled: its pages are space the next transaction can use (a
    /// WAL that had not reached SQLite's automatic checkpoint only grew: on
    /// a 3-MB file system the completion failed). Best effort: a reader may
    /// hold it.
    fn fold_wal(&self) {
        let _ = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }

    /// A transaction that failed because the disk filled before the
    /// low-space check saw it coming (another process filled it between
    /// two commits): its counters and rollups are set back to before it
    /// (nothing of it was stored), the space set aside handed back, and the
    /// batch applied again past the cap (calls and waits counted as
    /// dropped, the note stored); only if that fails too does the writer
    /// stop. The block bases and call ids the rolled-back transaction
    /// advanced are not used again: past the cap no call or block is stored.
    fn after_disk_filled(
        &mut self,
        batch: &[Msg],
        (n, rollup): (Counters, sleuth_core::rollup::Rollup),
        e: &rusqlite::Error,
    ) {
        self.n = n;
        self.rollup = rollup;
        let free = self.disk.as_mut().map_or(0, |d| d.ran_out());
        self.fold_wal();
        self.db_full = true;
        self.disk_note = Some(format!(
            "the disk holding the trace filled ({e}; {free} bytes free once the space set aside at its start \
             was handed back): later calls and waits are counted in stats.drop_db_full, not stored"
        ));
        if let Err(e) = self.apply(batch) {
            self.failed = Some(format!("writing the trace failed: {e}"));
        }
    }

    fn apply(&mut self, batch: &[Msg]) -> rusqlite::Result<()> {
        // Notes are stamped when stored, on the file's clock.
        let now = || file_clock::on_file_clock(monotonic_now_ns(), self.clock_base_ns);
        let tx = self.conn.transaction()?;
        let mut cap_hit_now = false;
        // The hot statements, prepared once per transaction, not per row.
        // Taken back only once the transaction commits: a base row rolled
        // back must not be named by a later row.
        let mut rows = EventRows::new(&tx, std::mem::take(&mut self.block_bases));
        for m in batch {
            match m {
                Msg::Event(e) => {
                    store_event(&mut self.n, &mut self.rollup, self.db_full, &mut rows, e)?
                }
                Msg::Events(evs) => {
                    for e in evs {
                        store_event(&mut self.n, &mut self.rollup, self.db_full, &mut rows, e)?;
                    }
                }
                Msg::Process(p) => upsert_process(&tx, p)?,
                Msg::Library(l) => insert_library(&tx, l)?,
                Msg::Note(level, text) => insert_note(&tx, now(), level.as_str(), text)?,
                Msg::Stat(name, v) if name == DECODE_ERRORS => {
                    self.n.decode_errors_upstream = *v;
                }
                Msg::Stat(name, v) => set_stat(&tx, name, *v)?,
                Msg::OpCounts(counts) => {
                    for c in counts {
                        upsert_op_count(&tx, c)?;
                    }
                }
                // A few rows a second at most (one per changed count every
                // 200 ms): kept past the cap, like the GPU samples.
                Msg::CountSamples(samples) => {
                    for c in samples {
                        insert_count_sample(&tx, c)?;
                    }
                }
                Msg::SessionEnd(ns) => {
                    tx.execute(
                        "UPDATE session SET end_mono_ns = ?1 WHERE id = 1",
                        [*ns as i64],
                    )?;
                }
                // Samples are few (one per GPU every few hundred ms) and needed to
                // judge GPU busy over the whole run: kept past the cap, like lifecycle events.
                Msg::GpuSamples(samples) => {
                    for g in samples {
                        tx.execute(
                            "INSERT INTO gpu_samples(ts_ns, gpu, busy_pct, period_ns) VALUES (?1, ?2, ?3, ?4)",
                            params![g.ts_ns as i64, g.gpu, g.busy_pct, g.period_ns as i64],
                        )?;
                    }
                }
                Msg::ProcessGpuSamples(samples) => {
                    for g in samples {
                        tx.execute(
                            "INSERT INTO process_gpu_samples(ts_ns, gpu, pid, used_bytes, sm_pct, phase)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                            params![
                                g.ts_ns as i64,
                                g.gpu,
                                g.pid,
                                g.used_bytes.map(|b| b as i64),
                                g.sm_pct,
                                g.phase.as_str()
                            ],
                        )?;
                    }
                }
                // Few (one per distinct site) and named by stored calls: kept
                // until the cap, like calls.
                Msg::Stack(st) => {
                    if self.db_full {
                        self.n.stacks_db_full += 1;
                    } else {
                        crate::stacks::insert(&tx, st)?;
                    }
                }
                Msg::Flush(_) | Msg::Finish(_) => {}
            }
        }
        rows.flush_calls()?;
        let (starts, classes) = (rows.starts, rows.classes);
        let block_bases = std::mem::take(&mut rows.block_bases);
        drop(rows);
        if let Some(starts) = starts {
            self.next_call_id = store_call_block(&tx, self.next_call_id, starts, classes)?;
        }
        if !self.db_full && db_bytes(&tx, &self.path)? >= self.opts.max_db_bytes {
            self.db_full = true;
            cap_hit_now = true;
        }
        if let Some(text) = self.disk_note.take() {
            insert_note(&tx, now(), NoteLevel::Warn.as_str(), &text)?;
        }
        if cap_hit_now {
            let text = format!(
                "database size cap of {} bytes reached: later calls and waits are counted in stats.drop_db_full, not stored",
                self.opts.max_db_bytes
            );
            insert_note(&tx, now(), NoteLevel::Warn.as_str(), &text)?;
        }
        write_counters(&tx, &self.n)?;
        let before = thread_cpu_ns();
        tx.commit()?;
        self.block_bases = block_bases;
        self.commit_cpu_ns += thread_cpu_ns().saturating_sub(before);
        self.batches += 1;
        Ok(())
    }

    /// [`Self::finish`], and where the disk filled meanwhile, once more
    /// with the space set aside handed back (the completion is one
    /// transaction: a failed one left nothing). The reserve is kept until
    /// then: handed back before, a `--rotate` run's next file took it as
    /// its own (round 60's third tester: on a 5-MB disk every finished
    /// file's completion found no room). Not for a run's file: its
    /// completion also hands the run's carried state on, which a failed
    /// attempt may have begun to.
    fn finish_in_reserve(&mut self) -> rusqlite::Result<WriteSummary> {
        let retry = self.opts.run.is_none();
        match self.finish() {
            Err(e)
                if retry
                    && disk_full(&e)
                    && self.disk.as_ref().is_some_and(|d| d.holds_reserve()) =>
            {
                if let Some(d) = self.disk.as_mut() {
                    d.release();
                }
                self.fold_wal();
                self.finish()
            }
            other => other,
        }
    }

    fn finish(&mut self) -> rusqlite::Result<WriteSummary> {
        if let Some(text) = self.disk_note.take() {
            let now = file_clock::on_file_clock(monotonic_now_ns(), self.clock_base_ns);
            insert_note(&self.conn, now, NoteLevel::Warn.as_str(), &text)?;
        }
        set_stat(&self.conn, "writer_batches", self.batches)?;
        set_stat(&self.conn, "writer_cpu_ns_commit", self.commit_cpu_ns)?;
        // The completion's replays and views are its peak: the heap the
        // capture freed goes back first, not beside them (a rotated run
        // keeping 250,000 PyTorch blocks live: 62-63 -> 57 MiB, round 36).
        release_freed_heap();
        let culprit_rows =
            finalize::complete(&mut self.conn, &self.rollup, self.opts.run.as_ref())?;
        // One self-contained file: checkpoint the WAL and leave WAL mode.
        let kept_wal = !leave_wal(&self.conn)?;
        let db_bytes = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(WriteSummary {
            calls_stored: self.n.calls_stored,
            waits_stored: self.n.waits_stored,
            proc_events_stored: self.n.procs_stored,
            dropped_db_full: self.n.drop_db_full,
            events_received: self.n.events_call
                + self.n.events_wait
                + self.n.events_proc
                + self.n.events_block,
            call_culprit_rows: culprit_rows,
            db_bytes,
            kept_wal,
            disk_ran_low: self.disk.as_ref().and_then(|d| d.ran_low()),
        })
    }
}

/// Whether SQLite's error says the disk (or the file's size limit) is full.
fn disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// How long leaving WAL mode waits for readers of the file to let go.
const LEAVE_WAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Checkpoints a complete file's WAL and leaves WAL mode, so the trace is
/// one file; false when readers kept it open past [`LEAVE_WAL_WAIT`] (a
/// `stats` run as the trace ended). The switch needs the file to itself:
/// a reader's lock made it fail at once with "database is locked", after
/// the completion had committed, and the tracer called a complete file
/// failed, exit 1 (round 50). Then the file stays in WAL mode, complete
/// (readers read its `-wal` with it), and the next writer to open it folds
/// it in (`gpusleuth finish`).
pub(crate) fn leave_wal(conn: &Connection) -> rusqlite::Result<bool> {
    leave_wal_within(conn, LEAVE_WAL_WAIT)
}

fn leave_wal_within(conn: &Connection, wait: std::time::Duration) -> rusqlite::Result<bool> {
    // SQLite does not call a busy handler for this switch: it is retried
    // here until the wait is over.
    let until = std::time::Instant::now() + wait;
    loop {
        match conn.pragma_update(None, "journal_mode", "DELETE") {
            Ok(()) => return Ok(true),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                if std::time::Instant::now() >= until {
                    return Ok(false);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

fn write_counters(tx: &Connection, n: &Counters) -> rusqlite::Result<()> {
    set_stat(tx, "events_call", n.events_call)?;
    set_stat(tx, "events_wait", n.events_wait)?;
    set_stat(tx, "events_proc", n.events_proc)?;
    if n.events_block > 0 {
        set_stat(tx, "events_block", n.events_block)?;
    }
    set_stat(tx, "drop_db_full", n.drop_db_full)?;
    if n.stacks_db_full > 0 {
        set_stat(tx, "stacks_db_full", n.stacks_db_full)?;
    }
    set_stat(
        tx,
        DECODE_ERRORS,
        n.decode_errors.saturating_add(n.decode_errors_upstream),
    )
}

/// The `stats` row counting records and rows that could not be decoded or stored.
const DECODE_ERRORS: &str = "decode_errors";

/// Nice +10 for the calling thread only (Linux: PRIO_PROCESS with a thread
/// id). Best effort: on failure the writer keeps the normal priority.
fn lower_own_priority() {
    // SAFETY: gettid has no preconditions; setpriority takes plain integers
    // and only changes the scheduling priority of this thread.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// Pages in use plus the WAL file: what the trace occupies on disk.
fn db_bytes(conn: &Connection, path: &Path) -> rusqlite::Result<u64> {
    // Cached, as the writer's other statements: compiled anew at each
    // transaction, these queries were where 3% of the writer thread's
    // samples fell in a VM profile of a launch flood (round 25).
    let pages: i64 = conn
        .prepare_cached("PRAGMA page_count")?
        .query_row([], |r| r.get(0))?;
    let page_size: i64 = conn
        .prepare_cached("PRAGMA page_size")?
        .query_row([], |r| r.get(0))?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    Ok((pages.max(0) as u64) * (page_size.max(0) as u64) + wal_len)
}

/// One event into its rows, counted; past the size cap only counted
/// (lifecycle events are kept: they are few and `processes` needs them).
fn store_event<'b>(
    n: &mut Counters,
    rollup: &mut sleuth_core::rollup::Rollup,
    db_full: bool,
    rows: &mut EventRows<'_, 'b>,
    e: &'b Event,
) -> rusqlite::Result<()> {
    match e {
        Event::Call(c) => {
            n.events_call += 1;
            if db_full {
                n.drop_db_full += 1;
            } else if rows.call(c)? {
                rollup.add_call(c);
                n.calls_stored += 1;
            } else {
                n.decode_errors += 1;
            }
        }
        Event::Wait(w) => {
            n.events_wait += 1;
            if db_full {
                n.drop_db_full += 1;
            } else {
                rows.wait(w)?;
                n.waits_stored += 1;
            }
        }
        Event::Nccl(nc) => {
            n.events_call += 1;
            if db_full {
                n.drop_db_full += 1;
            } else if let Some(call_id) = rows.call_with_id(&nc.call)? {
                rows.nccl(nc, call_id)?;
                rollup.add_call(&nc.call);
                n.calls_stored += 1;
            } else {
                n.decode_errors += 1;
            }
        }
        Event::Block(b) => {
            n.events_block += 1;
            if db_full {
                n.drop_db_full += 1;
            } else {
                rows.block(b)?;
            }
        }
        Event::Proc(p) => {
            n.events_proc += 1;
            rows.proc(p)?;
            n.procs_stored += 1;
            if p.kind == sleuth_core::ProcKind::Exit {
                // Its threads' windows wait for the completion in the file,
                // not in memory (a node's short-lived processes, round 46).
                for ((pid, tid), w) in rollup.take_process(p.pid) {
                    rows.thread_windows(pid, tid, &w)?;
                }
            }
        }
    }
    Ok(())
}

/// The event tables' INSERT statements of one transaction, each prepared on
/// first use and held to the end of the batch: a statement-cache lookup
/// (hashing the SQL text) per row was a measurable share of the writer's
/// time per event. Plain calls (the bulk of a trace) are stored
/// [`CALLS_PER_INSERT`] rows per statement. The rows stored are the same, in
/// the same order, so they get the same ids.
struct EventRows<'tx, 'b> {
    tx: &'tx Transaction<'tx>,
    /// Calls waiting for a full multi-row INSERT (none needs its row id).
    calls: Vec<&'b CallEvent>,
    call: Option<CallInsert<'tx>>,
    call_multi: Option<CallInsert<'tx>>,
    host_ptr: Option<CachedStatement<'tx>>,
    nccl: Option<CachedStatement<'tx>>,
    wait: Option<CachedStatement<'tx>>,
    waker: Option<CachedStatement<'tx>>,
    culprit: Option<CachedStatement<'tx>>,
    block: Option<CachedStatement<'tx>>,
    proc: Option<CachedStatement<'tx>>,
    windows: Option<CachedStatement<'tx>>,
    /// The earliest and latest start of the calls stored, and their ops'
    /// classes (`call_blocks`).
    starts: Option<(u64, u64)>,
    classes: i64,
    /// Which words of an allocator event to leave out (`block_bases`).
    block_bases: crate::block_bases::BlockBases,
}

/// The statement in `slot`, prepared (through the connection's cache) on first use.
fn stmt<'a, 'tx>(
    tx: &'tx Transaction<'tx>,
    slot: &'a mut Option<CachedStatement<'tx>>,
    sql: impl FnOnce() -> String,
) -> rusqlite::Result<&'a mut CachedStatement<'tx>> {
    first_use(slot, || tx.prepare_cached(&sql()))
}

/// The call INSERT of `rows` rows in `slot`, prepared on first use.
fn call_insert<'a, 'tx>(
    tx: &'tx Transaction<'tx>,
    slot: &'a mut Option<CallInsert<'tx>>,
    rows: usize,
) -> rusqlite::Result<&'a mut CallInsert<'tx>> {
    first_use(slot, || CallInsert::prepare(tx, rows))
}

/// What `slot` holds, made by `make` the first time.
fn first_use<T>(
    slot: &mut Option<T>,
    make: impl FnOnce() -> rusqlite::Result<T>,
) -> rusqlite::Result<&mut T> {
    if slot.is_none() {
        *slot = Some(make()?);
    }
    Ok(slot.as_mut().expect("made just above"))
}

/// Rows of plain calls per multi-row INSERT: one statement execution
/// (cursor opened, table seeked) for many rows. 32 × 15 = 480 parameters,
/// far below SQLite's limit.
const CALLS_PER_INSERT: usize = 32;
/// Columns bound per `call_rows` row.
const CALL_COLUMNS: usize = 15;

/// `INSERT INTO call_rows` of `rows` rows, parameters bound in order.
fn insert_calls_sql(rows: usize) -> String {
    let row = format!("({})", vec!["?"; CALL_COLUMNS].join(","));
    format!(
        "INSERT INTO call_rows(ts_ns, dur_ns, pid_gap, tid, op_id, ret, size, ptr, stream, kind,
            nested, runnable_ns, blocked_ns, cpu, stack_id) VALUES {}",
        vec![row; rows].join(",")
    )
}

/// A prepared `INSERT INTO call_rows` and the values its parameters hold.
/// SQLite keeps a statement's bindings across `sqlite3_reset` (rusqlite's
/// `raw_execute` resets and never clears them), so a parameter is bound
/// again only when its value changed: in a flood of launches most columns
/// of row i of one multi-row INSERT equal those of row i of the previous
/// one (pid, tid, op, ret, stream, cpu, the NULL ones), and the bind calls
/// were a seventh of the writer's CPU (a VM profile, round 20). Held for
/// one transaction: the statement cache clears the bindings when it takes
/// the statement back, and a new `CallInsert` starts knowing none.
struct CallInsert<'tx> {
    st: CachedStatement<'tx>,
    /// Per parameter (0-based): the value bound, `None` until first bound.
    bound: Vec<Option<Option<i64>>>,
}

impl<'tx> CallInsert<'tx> {
    fn prepare(tx: &'tx Transaction<'tx>, rows: usize) -> rusqlite::Result<Self> {
        Ok(CallInsert {
            st: tx.prepare_cached(&insert_calls_sql(rows))?,
            bound: vec![None; rows * CALL_COLUMNS],
        })
    }

    /// Binds one call's columns as parameters `first + 1 ..= first + 15`,
    /// those whose value changed. The op as its id (`ops` maps it to layer
    /// and name); `on_cpu_ns` is derived by the `calls` view: both were most
    /// of a row's bytes.
    fn bind(&mut self, first: usize, c: &CallEvent, op_id: u16) -> rusqlite::Result<()> {
        let values: [Option<i64>; CALL_COLUMNS] = [
            Some(c.ts_ns as i64),
            Some(c.dur_ns as i64),
            // The thread's distance to its process (the `pid` column gives
            // the pid back): 0 on the main thread, a few bytes at most.
            Some(i64::from(c.tid) - i64::from(c.pid)),
            Some(i64::from(c.tid)),
            Some(i64::from(op_id)),
            Some(c.ret),
            c.size.map(|v| v as i64),
            c.ptr.map(|v| v as i64),
            c.stream.map(|v| v as i64),
            c.kind.map(|v| v as i64),
            Some(i64::from(c.nested)),
            Some(c.runnable_ns as i64),
            Some(c.blocked_ns as i64),
            Some(i64::from(c.cpu)),
            c.stack_id.map(|s| s as i64),
        ];
        for (k, v) in values.into_iter().enumerate() {
            let slot = &mut self.bound[first + k];
            if *slot != Some(v) {
                self.st.raw_bind_parameter(first + k + 1, v)?;
                *slot = Some(v);
            }
        }
        Ok(())
    }

    fn execute(&mut self) -> rusqlite::Result<usize> {
        self.st.raw_execute()
    }
}

const INSERT_HOST_PTR: &str = "INSERT INTO call_host_ptrs(call_id, host_ptr) VALUES (?1, ?2)";
const INSERT_NCCL: &str =
    "INSERT INTO nccl_calls(call_id, comm, new_comm, count, datatype, redop, peer, rank, nranks,
        color, unique_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
const INSERT_WAIT: &str =
    "INSERT INTO waits(pid_gap, tid, kind_id, off_ns, blocked_for, runnable_for, prev_state, cpu)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const INSERT_WAKER: &str =
    "INSERT INTO wait_wakers(wait_id, pid, tid, comm, irq) VALUES (?1, ?2, ?3, ?4, ?5)";
const INSERT_CULPRIT: &str =
    "INSERT INTO wait_culprits(wait_id, pid, tid, comm, ns) VALUES (?1, ?2, ?3, ?4, ?5)";
const INSERT_BLOCK: &str =
    "INSERT INTO allocator_rows(id, end_ns, dur_ns, pid, tid, op_id, requested, block, stack_id,
        base_back, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15)
     VALUES (?26, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,
        ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)";
const INSERT_PROC: &str = "INSERT INTO proc_events(ts_ns, kind, pid, tid, ppid, exit_code, comm)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

impl<'tx, 'b> EventRows<'tx, 'b> {
    fn new(tx: &'tx Transaction<'tx>, block_bases: crate::block_bases::BlockBases) -> Self {
        EventRows {
            tx,
            calls: Vec::with_capacity(CALLS_PER_INSERT),
            call: None,
            call_multi: None,
            host_ptr: None,
            nccl: None,
            wait: None,
            waker: None,
            culprit: None,
            block: None,
            proc: None,
            windows: None,
            starts: None,
            classes: 0,
            block_bases,
        }
    }

    /// Call `c` (of op `info`) is stored in this transaction: its start
    /// and its op's class join the block's.
    fn note_block(&mut self, c: &CallEvent, info: &sleuth_core::ops::OpInfo) {
        let t = c.ts_ns;
        self.starts = Some(self.starts.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        self.classes |= crate::call_blocks::class_bit(info);
    }

    /// Stores one call (perhaps together with the next ones); false when its
    /// op id is unknown (nothing stored).
    fn call(&mut self, c: &'b CallEvent) -> rusqlite::Result<bool> {
        if c.host_ptr.is_some() {
            // Its row id names its host pointer: stored on its own.
            return Ok(self.call_with_id(c)?.is_some());
        }
        let Some(info) = c.info() else {
            return Ok(false);
        };
        self.note_block(c, info);
        self.calls.push(c);
        if self.calls.len() == CALLS_PER_INSERT {
            let ins = call_insert(self.tx, &mut self.call_multi, CALLS_PER_INSERT)?;
            for (i, c) in self.calls.iter().enumerate() {
                let op_id = c.info().map_or(c.op, |info| info.id);
                ins.bind(i * CALL_COLUMNS, c, op_id)?;
            }
            ins.execute()?;
            self.calls.clear();
        }
        Ok(true)
    }

    /// Stores the calls still waiting for a full multi-row INSERT, one by one
    /// (before a call whose row id is needed, and at the end of the batch).
    fn flush_calls(&mut self) -> rusqlite::Result<()> {
        if self.calls.is_empty() {
            return Ok(());
        }
        let ins = call_insert(self.tx, &mut self.call, 1)?;
        for c in self.calls.drain(..) {
            let op_id = c.info().map_or(c.op, |info| info.id);
            ins.bind(0, c, op_id)?;
            ins.execute()?;
        }
        Ok(())
    }

    /// Stores one call now; its row id, or None when its op id is unknown (nothing stored).
    fn call_with_id(&mut self, c: &CallEvent) -> rusqlite::Result<Option<i64>> {
        self.flush_calls()?;
        let Some(info) = c.info() else {
            return Ok(None);
        };
        let ins = call_insert(self.tx, &mut self.call, 1)?;
        ins.bind(0, c, info.id)?;
        ins.execute()?;
        let id = self.tx.last_insert_rowid();
        self.note_block(c, info);
        if let Some(hp) = c.host_ptr {
            stmt(self.tx, &mut self.host_ptr, || INSERT_HOST_PTR.into())?
                .execute(params![id, hp as i64])?;
        }
        Ok(Some(id))
    }

    /// The arguments of an NCCL call stored just before as `calls` row `call_id`.
    fn nccl(&mut self, n: &sleuth_core::nccl::NcclEvent, call_id: i64) -> rusqlite::Result<()> {
        // Handles are pointers: stored as their bit pattern (like `calls.ptr`).
        stmt(self.tx, &mut self.nccl, || INSERT_NCCL.into())?.execute(params![
            call_id,
            n.comm.map(|v| v as i64),
            n.new_comm.map(|v| v as i64),
            n.count.map(|v| v as i64),
            n.datatype,
            n.redop,
            n.peer,
            n.rank,
            n.nranks,
            n.color,
            n.unique_id
        ])?;
        Ok(())
    }

    fn wait(&mut self, w: &WaitEvent) -> rusqlite::Result<()> {
        // The pid, the kind's name, the wake-up and return times and the
        // blocked and runnable parts are the table's generated columns (the
        // differences as they are: the times come back exactly, even out of
        // order).
        stmt(self.tx, &mut self.wait, || INSERT_WAIT.into())?.execute(params![
            i64::from(w.tid) - i64::from(w.pid),
            w.tid,
            schema::wait_kind_id(w.kind),
            w.off_ns as i64,
            (w.wake_ns as i64).wrapping_sub(w.off_ns as i64),
            (w.on_ns as i64).wrapping_sub(w.wake_ns as i64),
            w.prev_state,
            w.cpu
        ])?;
        let wait_id = self.tx.last_insert_rowid();
        if let Some(k) = &w.waker {
            stmt(self.tx, &mut self.waker, || INSERT_WAKER.into())?
                .execute(params![wait_id, k.pid, k.tid, k.comm, k.irq])?;
        }
        if !w.culprits.is_empty() {
            let st = stmt(self.tx, &mut self.culprit, || INSERT_CULPRIT.into())?;
            for c in &w.culprits {
                st.execute(params![wait_id, c.pid, c.tid, c.comm, c.ns as i64])?;
            }
        }
        Ok(())
    }

    fn block(&mut self, b: &sleuth_core::BlockEvent) -> rusqlite::Result<()> {
        let st = stmt(self.tx, &mut self.block, || INSERT_BLOCK.into())?;
        let id = self.block_bases.next_id();
        st.raw_bind_parameter(26, id)?;
        // The end and the duration: the start is a few bytes from the end
        // (allocator calls take microseconds), stored whole it took 6.
        st.raw_bind_parameter(1, b.end_ns as i64)?;
        st.raw_bind_parameter(2, (b.end_ns as i64).wrapping_sub(b.start_ns as i64))?;
        st.raw_bind_parameter(3, b.pid)?;
        // The main thread (most allocator events) as NULL: no byte.
        st.raw_bind_parameter(4, (b.tid != b.pid).then_some(b.tid))?;
        // Under its op-table id, as `call_rows.op_id` (`ops` names it).
        st.raw_bind_parameter(5, b.op)?;
        st.raw_bind_parameter(6, b.requested.map(|r| r as i64))?;
        // Bit patterns: user-space addresses fit, above i64::MAX round-trips.
        st.raw_bind_parameter(7, b.block as i64)?;
        st.raw_bind_parameter(8, b.stack_id.map(|s| s as i64))?;
        let base = self.block_bases.base_for(b.block, &b.words);
        st.raw_bind_parameter(9, base.map(|(base_id, _)| id - base_id))?;
        for (i, w) in b.words.iter().enumerate() {
            // Each word in the bytes its magnitude needs (a BLOB took 8
            // each), or left out where the base row holds it.
            let kept = base.is_none_or(|(_, words)| words[i] != *w);
            st.raw_bind_parameter(10 + i, kept.then_some(*w as i64))?;
        }
        let whole = base.is_none();
        st.raw_execute()?;
        self.block_bases.stored(id);
        if whole {
            self.block_bases.stored_whole(b.block, id, &b.words);
        }
        Ok(())
    }

    /// The windows of a thread of a process that exited, kept in the file
    /// for the completion (`crate::thread_windows`).
    fn thread_windows(&mut self, pid: u32, tid: u32, w: &ThreadWindows) -> rusqlite::Result<()> {
        if self.windows.is_none() {
            crate::thread_windows::create(self.tx)?;
        }
        stmt(self.tx, &mut self.windows, || {
            crate::thread_windows::INSERT.into()
        })?
        .execute(params![pid, tid, crate::thread_windows::encode(w)?])?;
        Ok(())
    }

    fn proc(&mut self, p: &ProcEvent) -> rusqlite::Result<()> {
        let ppid = matches!(p.kind, sleuth_core::ProcKind::Fork).then_some(p.ppid);
        let code = matches!(p.kind, sleuth_core::ProcKind::Exit).then_some(p.exit_code);
        stmt(self.tx, &mut self.proc, || INSERT_PROC.into())?.execute(params![
            p.ts_ns as i64,
            p.kind.as_str(),
            p.pid,
            p.tid,
            ppid,
            code,
            p.comm
        ])?;
        Ok(())
    }
}

/// Stores the block of the calls this transaction stored (row ids from
/// `first_id` to the table's last, `starts`: their earliest and latest
/// start, `classes`: their ops' class bits); returns the next call's row
/// id. One indexed lookup and one row per transaction (thousands of
/// events). A block never claims less than its rows: `first_id` starts at
/// 1, so a file the writer did not create empty gets a wider first block,
/// never a gap.
fn store_call_block(
    tx: &Transaction,
    first_id: i64,
    starts: (u64, u64),
    classes: i64,
) -> rusqlite::Result<i64> {
    let last_id: i64 = tx
        .prepare_cached("SELECT coalesce(max(id), 0) FROM call_rows")?
        .query_row([], |r| r.get(0))?;
    let ns = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "INSERT INTO call_blocks(first_id, last_id, min_ts_ns, max_ts_ns, classes)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        first_id,
        last_id,
        ns(starts.0),
        ns(starts.1),
        classes
    ])?;
    Ok(last_id.saturating_add(1))
}

/// Events a message carries (the batch-size count).
fn msg_events(m: &Msg) -> usize {
    match m {
        Msg::Event(_) => 1,
        Msg::Events(v) => v.len(),
        _ => 0,
    }
}

pub(crate) fn upsert_process(tx: &Connection, p: &ProcessInfo) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT OR REPLACE INTO processes(pid, ppid, comm, cmdline, start_ns, exit_ns, exit_code, oom_victim)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    st.execute(params![
        p.pid,
        p.ppid,
        p.comm,
        p.cmdline,
        p.start_ns.map(|v| v as i64),
        p.exit_ns.map(|v| v as i64),
        p.exit_code,
        p.oom_victim
    ])?;
    Ok(())
}

fn insert_library(tx: &Transaction, l: &LibraryInfo) -> rusqlite::Result<()> {
    let missing = serde_json::to_string(&l.missing).unwrap_or_else(|_| "[]".into());
    tx.execute(
        "INSERT INTO libraries(path, layer, dev, ino, attached_mono_ns, probes, missing)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            l.path,
            l.layer.map(|x| x.as_str()),
            l.dev.map(|v| v as i64),
            l.ino.map(|v| v as i64),
            l.attached_mono_ns.map(|v| v as i64),
            l.probes,
            missing
        ],
    )?;
    Ok(())
}

pub(crate) fn insert_note(
    tx: &Connection,
    ts_ns: u64,
    level: &str,
    text: &str,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO notes(ts_ns, level, text) VALUES (?1, ?2, ?3)",
        params![ts_ns as i64, level, text],
    )?;
    Ok(())
}

pub(crate) fn set_stat(tx: &Connection, name: &str, value: u64) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT INTO stats(name, value) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value",
    )?;
    st.execute(params![name, value as i64])?;
    Ok(())
}

fn insert_count_sample(
    tx: &Transaction,
    c: &sleuth_core::counted::CountSample,
) -> rusqlite::Result<()> {
    let Some(info) = sleuth_core::op_by_id(c.op) else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT INTO op_count_samples(ts_ns, pid, op, count) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![c.ts_ns as i64, c.pid, info.name, c.count as i64])?;
    Ok(())
}

fn upsert_op_count(tx: &Transaction, c: &OpCount) -> rusqlite::Result<()> {
    let Some(info) = sleuth_core::op_by_id(c.op) else {
        return Ok(());
    };
    let mut st = tx.prepare_cached(
        "INSERT INTO op_counts(pid, layer, op, count) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(pid, op) DO UPDATE SET count = excluded.count",
    )?;
    st.execute(params![
        c.pid,
        info.layer.as_str(),
        info.name,
        c.count as i64
    ])?;
    Ok(())
}

/// Hands the heap's free pages back to the system: glibc keeps up to the
/// trim threshold of each arena (8 MiB in the tracer, `trace`'s
/// `tune_malloc`) and every freed page below an arena's top.
pub fn release_freed_heap() {
    // glibc's allocator only (other C libraries have no malloc_trim).
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's
    // arenas; it touches no live allocation and has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that keeps its read transaction past the wait leaves the
    /// file in WAL mode, whole (no error); once it lets go, the next
    /// attempt makes it one file.
    #[test]
    fn a_reader_that_stays_keeps_a_complete_file_in_wal_mode() {
        let dir = std::env::temp_dir().join(format!("sleuth-leave-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        let reader = Connection::open(&path).unwrap();
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .unwrap();
        let wait = std::time::Duration::from_millis(100);
        assert!(!leave_wal_within(&conn, wait).unwrap());
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(reader);
        assert!(leave_wal_within(&conn, wait).unwrap());
        drop(conn);
        assert!(!dir.join("t.db-wal").exists());
        let n: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT x FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
