//! The trace database schema (documented column by column in docs/schema.md).

use rusqlite::Connection;

/// Bumped on any incompatible change. Version 2 stores calls in `call_rows`
/// with the op as an integer (`ops`) behind a `calls` view with version 1's
/// columns; version 3 stores allocator events in `allocator_rows` with the
/// op as an integer and the 16 `Block` words as 16 integer columns (`w0`..
/// `w15`; version 2 had one 128-byte `words` BLOB: SQLite stores each
/// integer in the bytes its magnitude needs, 66 bytes on real PyTorch
/// traces, docs/benchmarks.md round 27) behind an `allocator_events` view
/// with the op's name; version 4 leaves out (NULL) the words of an
/// allocator row that equal those of an earlier row of the same block,
/// named by `base_id`, which the view puts back (real PyTorch traces: half
/// of each `Block` changes between its events, docs/benchmarks.md round
/// 28); version 5 stores an allocator row's duration instead of its start,
/// its thread as NULL when it is the process's main thread, and its base
/// row as how many rows back it lies (`base_back`), each a few bytes where
/// the value they replace took up to 6 (the view gives back version 4's
/// columns). Readers read every version ([`READABLE_VERSIONS`]), writers
/// write this one.
/// Version 6 computes a row's pid from its tid and a small
/// `pid_gap`, a wait's kind from a number and its blocked and runnable
/// parts from its times, in generated columns (a long-running node's pids
/// took 3 bytes in every row: docs/benchmarks.md round 33).
pub const SCHEMA_VERSION: i64 = 6;

/// Every schema version the readers accept.
pub const READABLE_VERSIONS: &[i64] = &[1, 2, 3, 4, 5, 6];

/// Value of `meta.tool` in every database this crate writes.
pub const TOOL: &str = "gpusleuth";

pub(crate) const CREATE: &str = r#"
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE session(
    id INTEGER PRIMARY KEY CHECK(id = 1),
    started_unix_ns INTEGER NOT NULL,
    start_mono_ns INTEGER NOT NULL,
    end_mono_ns INTEGER,
    realtime_offset_ns INTEGER NOT NULL,
    hostname TEXT NOT NULL,
    kernel TEXT NOT NULL,
    command TEXT NOT NULL,
    target TEXT NOT NULL,
    launch_mode TEXT NOT NULL,
    tool_version TEXT NOT NULL
);
CREATE TABLE stats(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE libraries(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    layer TEXT,
    dev INTEGER,
    ino INTEGER,
    attached_mono_ns INTEGER,
    probes INTEGER NOT NULL,
    missing TEXT NOT NULL
);
CREATE TABLE notes(ts_ns INTEGER NOT NULL, level TEXT NOT NULL, text TEXT NOT NULL);
CREATE TABLE processes(
    pid INTEGER PRIMARY KEY,
    ppid INTEGER,
    comm TEXT NOT NULL,
    cmdline TEXT NOT NULL,
    start_ns INTEGER,
    exit_ns INTEGER,
    exit_code INTEGER,
    oom_victim INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE proc_events(
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    kind TEXT NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    ppid INTEGER,
    exit_code INTEGER,
    comm TEXT NOT NULL
);
CREATE TABLE ops(id INTEGER PRIMARY KEY, layer TEXT NOT NULL, op TEXT NOT NULL);
CREATE TABLE call_rows(
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    dur_ns INTEGER NOT NULL,
    pid INTEGER GENERATED ALWAYS AS (tid - pid_gap) VIRTUAL,
    tid INTEGER NOT NULL,
    op_id INTEGER NOT NULL,
    ret INTEGER NOT NULL,
    size INTEGER,
    ptr INTEGER,
    stream INTEGER,
    kind INTEGER,
    nested INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    stack_id INTEGER,
    pid_gap INTEGER NOT NULL
);
CREATE INDEX call_rows_stack ON call_rows(stack_id) WHERE stack_id IS NOT NULL;
-- One row per writer transaction that stored calls: its call rows' id range,
-- their earliest and latest start and their ops' classes (a bit per
-- OpClass): a read of a file still being written, which has no call-row
-- index yet, keeps to the blocks that can hold its calls (`call_blocks`).
CREATE TABLE call_blocks(
    first_id INTEGER NOT NULL,
    last_id INTEGER NOT NULL,
    min_ts_ns INTEGER NOT NULL,
    max_ts_ns INTEGER NOT NULL,
    classes INTEGER NOT NULL
);
CREATE TABLE waits(
    id INTEGER PRIMARY KEY,
    pid INTEGER GENERATED ALWAYS AS (tid - pid_gap) VIRTUAL,
    tid INTEGER NOT NULL,
    kind TEXT GENERATED ALWAYS AS (CASE kind_id WHEN 0 THEN 'preempted' WHEN 1 THEN 'blocked' ELSE 'unknown' END) VIRTUAL,
    off_ns INTEGER NOT NULL,
    wake_ns INTEGER GENERATED ALWAYS AS (off_ns + blocked_for) VIRTUAL,
    on_ns INTEGER GENERATED ALWAYS AS (off_ns + blocked_for + runnable_for) VIRTUAL,
    prev_state INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    blocked_ns INTEGER GENERATED ALWAYS AS (max(blocked_for, 0)) VIRTUAL,
    runnable_ns INTEGER GENERATED ALWAYS AS (max(runnable_for, 0)) VIRTUAL,
    pid_gap INTEGER NOT NULL,
    kind_id INTEGER NOT NULL,
    blocked_for INTEGER NOT NULL,
    runnable_for INTEGER NOT NULL
);
-- One index: readers go thread by thread (a process's threads from the
-- call groups or a skip through this index); a `(pid, on_ns)` index cost
-- 3.5 bytes per event of a 10M-call trace (docs/benchmarks.md, round 27).
CREATE INDEX waits_tid_on ON waits(tid, on_ns);
CREATE TABLE wait_culprits(wait_id INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, comm TEXT NOT NULL, ns INTEGER NOT NULL);
CREATE INDEX wait_culprits_wait ON wait_culprits(wait_id);
CREATE TABLE wait_wakers(wait_id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, tid INTEGER NOT NULL, comm TEXT NOT NULL, irq INTEGER NOT NULL);
CREATE TABLE call_host_ptrs(call_id INTEGER PRIMARY KEY, host_ptr INTEGER NOT NULL);
CREATE TABLE call_culprits(call_id INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, comm TEXT NOT NULL, runnable_ns INTEGER NOT NULL);
CREATE INDEX call_culprits_call ON call_culprits(call_id);
CREATE TABLE op_counts(pid INTEGER NOT NULL, layer TEXT NOT NULL, op TEXT NOT NULL, count INTEGER NOT NULL, PRIMARY KEY(pid, op));
CREATE TABLE allocator_rows(
    id INTEGER PRIMARY KEY,
    end_ns INTEGER NOT NULL,
    -- Version 5: end_ns - start_ns (version 4 stored start_ns).
    dur_ns INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    -- Version 5: NULL when the thread is the process's main one (= pid).
    tid INTEGER,
    op_id INTEGER NOT NULL,
    requested INTEGER,
    block INTEGER NOT NULL,
    stack_id INTEGER,
    -- The row whose words this row's NULL words are (a row of the same
    -- block that stores all 16), as how many rows before this one it lies
    -- (version 4: its id, `base_id`); NULL when this row stores all.
    base_back INTEGER,
    w0 INTEGER, w1 INTEGER, w2 INTEGER, w3 INTEGER, w4 INTEGER, w5 INTEGER, w6 INTEGER, w7 INTEGER,
    w8 INTEGER, w9 INTEGER, w10 INTEGER, w11 INTEGER, w12 INTEGER, w13 INTEGER, w14 INTEGER, w15 INTEGER
);
-- No index by (pid, end_ns) unless the rows are out of that order (see
-- `ALLOCATOR_INDEX`).
CREATE TABLE gpu_samples(
    ts_ns INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    busy_pct REAL NOT NULL,
    period_ns INTEGER NOT NULL
);
CREATE INDEX gpu_samples_ts ON gpu_samples(ts_ns);
CREATE TABLE process_gpu_samples(
    ts_ns INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    used_bytes INTEGER,
    sm_pct REAL,
    phase TEXT NOT NULL
);
CREATE INDEX process_gpu_samples_pid ON process_gpu_samples(pid, ts_ns);
CREATE TABLE op_count_samples(ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, op TEXT NOT NULL, count INTEGER NOT NULL);
CREATE INDEX op_count_samples_pid ON op_count_samples(pid, ts_ns);
CREATE TABLE nccl_calls(
    call_id INTEGER PRIMARY KEY,
    comm INTEGER,
    new_comm INTEGER,
    count INTEGER,
    datatype INTEGER,
    redop INTEGER,
    peer INTEGER,
    rank INTEGER,
    nranks INTEGER,
    color INTEGER,
    unique_id TEXT
);
CREATE TABLE rollup_ops(
    pid INTEGER NOT NULL,
    op TEXT NOT NULL,
    count INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    total_ns INTEGER NOT NULL,
    max_ns INTEGER NOT NULL,
    on_cpu_ns INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    PRIMARY KEY(pid, op)
) WITHOUT ROWID;
CREATE TABLE rollup_hist(
    pid INTEGER NOT NULL,
    op TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    count INTEGER NOT NULL,
    on_cpu_ns INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    PRIMARY KEY(pid, op, bucket)
) WITHOUT ROWID;
CREATE TABLE rollup_culprits(pid INTEGER NOT NULL, op TEXT NOT NULL, culprit_pid INTEGER NOT NULL, comm TEXT NOT NULL, runnable_ns INTEGER NOT NULL);
CREATE TABLE rollup_threads(pid INTEGER NOT NULL, tid INTEGER NOT NULL, split TEXT NOT NULL);
CREATE TABLE merge_nodes(
    node INTEGER PRIMARY KEY,
    hostname TEXT NOT NULL,
    source TEXT NOT NULL,
    realtime_offset_ns INTEGER NOT NULL,
    shift_ns INTEGER NOT NULL,
    skew_ns INTEGER NOT NULL,
    skew_applied INTEGER NOT NULL,
    skew_samples INTEGER NOT NULL,
    skew_spread_ns INTEGER,
    pid_offset INTEGER NOT NULL
);
CREATE TABLE process_nodes(pid INTEGER PRIMARY KEY, node INTEGER NOT NULL, host TEXT NOT NULL, host_pid INTEGER NOT NULL);
"#;

/// The view's 16 word columns, each the row's word or its base row's (the
/// text both version 4's and version 5's views hold, byte for byte).
macro_rules! words_or_base {
    () => {
        "           coalesce(a.w0, b.w0) AS w0, coalesce(a.w1, b.w1) AS w1, coalesce(a.w2, b.w2) AS w2,
           coalesce(a.w3, b.w3) AS w3, coalesce(a.w4, b.w4) AS w4, coalesce(a.w5, b.w5) AS w5,
           coalesce(a.w6, b.w6) AS w6, coalesce(a.w7, b.w7) AS w7, coalesce(a.w8, b.w8) AS w8,
           coalesce(a.w9, b.w9) AS w9, coalesce(a.w10, b.w10) AS w10, coalesce(a.w11, b.w11) AS w11,
           coalesce(a.w12, b.w12) AS w12, coalesce(a.w13, b.w13) AS w13, coalesce(a.w14, b.w14) AS w14,
           coalesce(a.w15, b.w15) AS w15
"
    };
}

/// The allocator events as readers read them (and version 2's table's
/// columns, the words apart): the start from the end and the duration,
/// the main thread's id from the pid, the op's name from `ops`, each word
/// left out of its row (NULL) taken from the row `base_back` rows before
/// it. A word that is NULL in both (a damaged file) reads as NULL, which
/// readers refuse.
pub(crate) const ALLOCATOR_VIEW: &str = concat!(
    "CREATE VIEW allocator_events AS
    SELECT a.id AS id, a.end_ns - a.dur_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid,
           coalesce(a.tid, a.pid) AS tid,
           o.op AS op, a.requested AS requested, a.block AS block, a.stack_id AS stack_id,
",
    words_or_base!(),
    "    FROM allocator_rows a JOIN ops o ON o.id = a.op_id
    LEFT JOIN allocator_rows b ON b.id = a.id - a.base_back"
);

/// Version 4's `allocator_events` view (the start, the thread and the base
/// row's id stored as they are): kept so that `schema_check` can check
/// version 4 traces, which readers still read.
pub(crate) const ALLOCATOR_VIEW_V4: &str = concat!(
    "CREATE VIEW allocator_events AS
    SELECT a.id AS id, a.start_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,
           o.op AS op, a.requested AS requested, a.block AS block, a.stack_id AS stack_id,
",
    words_or_base!(),
    "    FROM allocator_rows a JOIN ops o ON o.id = a.op_id LEFT JOIN allocator_rows b ON b.id = a.base_id"
);

/// Version 3's `allocator_events` view (every row stores its 16 words, no
/// `base_id`): kept so that `schema_check` can check version 3 traces,
/// which readers still read.
pub(crate) const ALLOCATOR_VIEW_V3: &str = "CREATE VIEW allocator_events AS
    SELECT a.id AS id, a.start_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,
           o.op AS op, a.requested AS requested, a.block AS block, a.stack_id AS stack_id,
           a.w0 AS w0, a.w1 AS w1, a.w2 AS w2, a.w3 AS w3, a.w4 AS w4, a.w5 AS w5, a.w6 AS w6,
           a.w7 AS w7, a.w8 AS w8, a.w9 AS w9, a.w10 AS w10, a.w11 AS w11, a.w12 AS w12,
           a.w13 AS w13, a.w14 AS w14, a.w15 AS w15
    FROM allocator_rows a JOIN ops o ON o.id = a.op_id";

/// `allocator_events` before version 3 (a table, the op's name in each row,
/// the words as one little-endian BLOB): kept so that `schema_check` can
/// check traces written before, which readers still read. Its `stack_id`
/// column was added by `ALTER TABLE`.
pub(crate) const ALLOCATOR_EVENTS_V2: &str = "CREATE TABLE allocator_events(
    id INTEGER PRIMARY KEY,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    op TEXT NOT NULL,
    requested INTEGER,
    block INTEGER NOT NULL,
    words BLOB NOT NULL
)";

/// Version 1's `calls` table (op and layer as text in every row), which
/// version 2 replaced by `call_rows` and the `calls` view: kept so that
/// `schema_check` can check traces written before, which readers still read.
/// Its `stack_id` column was added later (`ALTER TABLE`) and may be absent.
pub(crate) const CALLS_V1: &str = "CREATE TABLE calls(
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    dur_ns INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    layer TEXT NOT NULL,
    op TEXT NOT NULL,
    ret INTEGER NOT NULL,
    size INTEGER,
    ptr INTEGER,
    stream INTEGER,
    kind INTEGER,
    nested INTEGER NOT NULL,
    on_cpu_ns INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    cpu INTEGER NOT NULL
)";

/// The `calls` view of version 2: version 1's `calls` columns over
/// `call_rows` and `ops`, so SQL written against version 1 (`query`, MCP
/// `sql`, saved queries, the readers) runs unchanged. `on_cpu_ns` is derived
/// the way the writer computed it (`CallEvent::on_cpu_ns`, saturating).
/// `schema_check` accepts a `calls` view only with exactly this text.
pub(crate) const CALLS_VIEW: &str = "CREATE VIEW calls AS
    SELECT c.id AS id, c.ts_ns AS ts_ns, c.dur_ns AS dur_ns, c.pid AS pid, c.tid AS tid,
           o.layer AS layer, o.op AS op, c.ret AS ret, c.size AS size, c.ptr AS ptr,
           c.stream AS stream, c.kind AS kind, c.nested AS nested,
           max(c.dur_ns - c.runnable_ns - c.blocked_ns, 0) AS on_cpu_ns,
           c.runnable_ns AS runnable_ns, c.blocked_ns AS blocked_ns, c.cpu AS cpu,
           c.stack_id AS stack_id
    FROM call_rows c JOIN ops o ON o.id = c.op_id";

/// `call_rows` and `waits` as versions 2 to 5 have them (version 1's
/// calls are `CALLS_V1`): every column stored. Version 6 stores a thread's
/// distance to its process (`pid_gap`: 0 for the main thread, a few for the
/// others, where a node's pid took 3 bytes), a wait's kind as a number and
/// its wake-up and return as the time blocked and runnable before them
/// (`blocked_for`, `runnable_for`: a few bytes, 0 for a preemption's
/// blocked time, where each time took 6), and computes `pid`, `kind`,
/// `wake_ns`, `on_ns` and the wait's blocked and runnable parts in
/// generated columns of the same names (docs/benchmarks.md, round 33);
/// the `(tid, on_ns)` index holds the computed return.
pub(crate) const CALL_ROWS_V5: &str = "CREATE TABLE call_rows(
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    dur_ns INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    op_id INTEGER NOT NULL,
    ret INTEGER NOT NULL,
    size INTEGER,
    ptr INTEGER,
    stream INTEGER,
    kind INTEGER,
    nested INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    stack_id INTEGER
)";

/// `waits` of versions 1 to 5 (see [`CALL_ROWS_V5`]).
pub(crate) const WAITS_V5: &str = "CREATE TABLE waits(
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    kind TEXT NOT NULL,
    off_ns INTEGER NOT NULL,
    wake_ns INTEGER NOT NULL,
    on_ns INTEGER NOT NULL,
    prev_state INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    blocked_ns INTEGER NOT NULL,
    runnable_ns INTEGER NOT NULL
)";

/// The tables whose columns version 6 computes (generated columns): a
/// reader accepts them only with exactly the text gpusleuth writes, as a
/// view (`schema_check`).
pub(crate) const GENERATED_TABLES: &[&str] = &["call_rows", "waits"];

/// The wait kinds as version 6 stores them: `waits.kind_id` is the place
/// in this list (the generated `kind` of `WAITS`, spelled out in its DDL,
/// gives the name back: a test holds the two together).
const WAIT_KINDS: [sleuth_core::WaitKind; 2] = [
    sleuth_core::WaitKind::Preempted,
    sleuth_core::WaitKind::Blocked,
];

/// A wait's kind as version 6 stores it (`waits.kind_id`).
pub(crate) fn wait_kind_id(kind: sleuth_core::WaitKind) -> i64 {
    WAIT_KINDS
        .iter()
        .position(|&k| k == kind)
        .expect("every wait kind has an id") as i64
}

/// `CASE {column} WHEN name THEN id … END` (`reverse`: from the id to the
/// name, unknown ids `'unknown'`): the stored id of a kind named in
/// `column` (a version 5 file's, merged), and the generated `kind`.
pub(crate) fn wait_kind_case(column: &str, reverse: bool) -> String {
    let arms: String = WAIT_KINDS
        .iter()
        .enumerate()
        .map(|(id, k)| match reverse {
            false => format!(" WHEN '{}' THEN {id}", k.as_str()),
            true => format!(" WHEN {id} THEN '{}'", k.as_str()),
        })
        .collect();
    let other = if reverse { " ELSE 'unknown'" } else { "" };
    format!("CASE {column}{arms}{other} END")
}

/// Views over `calls` for people writing SQL (docs/schema.md).
pub(crate) const VIEWS: &str = r#"
CREATE VIEW calls_wall AS
    SELECT c.*, c.ts_ns + s.realtime_offset_ns AS ts_unix_ns,
           datetime((c.ts_ns + s.realtime_offset_ns) / 1000000000, 'unixepoch') AS ts_utc
    FROM calls c, session s;
CREATE VIEW op_summary AS
    SELECT pid, layer, op, count(*) AS calls, sum(ret != 0) AS errors,
           sum(dur_ns) AS total_ns, max(dur_ns) AS max_ns,
           sum(on_cpu_ns) AS on_cpu_ns, sum(runnable_ns) AS runnable_ns, sum(blocked_ns) AS blocked_ns
    FROM calls GROUP BY pid, layer, op;
CREATE VIEW call_culprits_named AS
    SELECT c.id AS call_id, c.op, c.pid AS call_pid, c.tid AS call_tid, c.ts_ns, c.dur_ns,
           k.pid AS culprit_pid, k.tid AS culprit_tid, k.comm AS culprit_comm, k.runnable_ns
    FROM call_culprits k JOIN calls c ON c.id = k.call_id;
"#;

/// Indexes whose keys arrive in random order (call durations): maintained
/// row by row they turn every insert into a random B-tree page write once
/// the index outgrows SQLite's page cache, so the writer builds them in one
/// sorted pass when the trace ends (`finalize`); other creators build them
/// at once. Readers' queries are the same either way (through the `calls`
/// view, `op = 'x'` finds the op's id in `ops`, then this index).
/// `(tid, ts_ns)` too: its keys arrive from several threads at once, and
/// row by row its pages split half full (3.4 MB against 3.0 MB built in one
/// pass, 200,000 calls on 4 threads: 1.6 bytes per event).
pub(crate) const LATE_INDEXES: &str =
    "CREATE INDEX IF NOT EXISTS call_rows_op_dur ON call_rows(op_id, dur_ns);
     CREATE INDEX IF NOT EXISTS call_rows_tid_ts ON call_rows(tid, ts_ns);";

/// The allocator rows' index in completion order, per process. The writer
/// stores allocator events as they are captured, which on real PyTorch
/// traces is their completion order: the completion then says so
/// (`meta.allocator_rows_in_end_order = 1`) and readers read the rows by id,
/// without this index (15 bytes per event of a real `--torch-allocator`
/// trace, docs/benchmarks.md round 28); it builds the index only for a
/// file whose rows are not in that order. Files before round 28 have it.
pub(crate) const ALLOCATOR_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS allocator_rows_pid ON allocator_rows(pid, end_ns)";

/// Creates every table, index and view and fills `meta`.
pub(crate) fn create(conn: &Connection, source: &str, tool_version: &str) -> rusqlite::Result<()> {
    create_deferring_late_indexes(conn, source, tool_version)?;
    conn.execute_batch(LATE_INDEXES)?;
    // Other creators do not say in which order they stored allocator rows.
    conn.execute_batch(ALLOCATOR_INDEX)
}

/// [`create`] without [`LATE_INDEXES`] (the writer adds them at the end).
pub(crate) fn create_deferring_late_indexes(
    conn: &Connection,
    source: &str,
    tool_version: &str,
) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute_batch(CALLS_VIEW)?;
    conn.execute_batch(ALLOCATOR_VIEW)?;
    conn.execute_batch(VIEWS)?;
    conn.execute_batch(crate::stacks::CREATE)?;
    // Every op this build knows, under its op-table id (what the writer
    // stores in `call_rows.op_id`); readers map ids through this table, not
    // through their own build's op table.
    let mut ops = conn.prepare("INSERT INTO ops(id, layer, op) VALUES (?1, ?2, ?3)")?;
    for o in sleuth_core::ops::OPS {
        ops.execute(rusqlite::params![o.id, o.layer.as_str(), o.name])?;
    }
    let mut st = conn.prepare("INSERT INTO meta(key, value) VALUES (?1, ?2)")?;
    st.execute(["schema_version", &SCHEMA_VERSION.to_string()])?;
    st.execute(["tool", TOOL])?;
    st.execute(["source", source])?;
    st.execute(["tool_version", tool_version])?;
    Ok(())
}

#[cfg(test)]
mod view_text_tests {
    /// The generated `kind` spelled out in the waits' DDL names each kind
    /// by the id `wait_kind_id` stores.
    #[test]
    fn the_waits_kind_names_the_ids_written() {
        let kind = format!(
            "kind TEXT GENERATED ALWAYS AS ({}) VIRTUAL,",
            super::wait_kind_case("kind_id", true)
        );
        assert!(super::CREATE.contains(&kind), "{kind}");
        for k in [
            sleuth_core::WaitKind::Preempted,
            sleuth_core::WaitKind::Blocked,
        ] {
            let arm = format!("WHEN {} THEN '{}'", super::wait_kind_id(k), k.as_str());
            assert!(kind.contains(&arm), "{arm}");
        }
    }

    /// The views' text is what files hold and readers compare byte for
    /// byte: assembled from a shared part, it must stay the text written.
    #[test]
    fn the_allocator_views_keep_their_text() {
        for (view, columns, from) in [
            (
                super::ALLOCATOR_VIEW,
                "a.end_ns - a.dur_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid,\n           coalesce(a.tid, a.pid) AS tid,\n",
                "\n    LEFT JOIN allocator_rows b ON b.id = a.id - a.base_back",
            ),
            (
                super::ALLOCATOR_VIEW_V4,
                "a.start_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,\n",
                " LEFT JOIN allocator_rows b ON b.id = a.base_id",
            ),
        ] {
            let words: Vec<String> = (0..16)
                .map(|i| format!("coalesce(a.w{i}, b.w{i}) AS w{i}"))
                .collect();
            assert!(view.starts_with("CREATE VIEW allocator_events AS\n    SELECT a.id AS id, "));
            assert!(view.contains(columns), "{view}");
            assert!(view.ends_with(&format!("FROM allocator_rows a JOIN ops o ON o.id = a.op_id{from}")));
            let flat = view.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(&words.join(", ")), "{view}");
        }
    }
}
