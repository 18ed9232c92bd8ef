//! `gpusleuth merge`: several per-node traces of one job in one database.
//!
//! Each input's rows are copied table by table with its timestamps moved
//! onto the first node's monotonic clock (`shift_ns`, decided by the caller
//! from the session offsets and the measured skew), its pids and tids moved
//! by `pid_offset` when they collide with an earlier node's, and row ids
//! moved past the rows already there (references to calls and waits follow).
//! Columns are recognized by name, so tables added later merge as long as
//! they follow the schema's naming: timestamps `ts_ns`, `start_ns`, `end_ns`,
//! `off_ns`, `wake_ns`, `on_ns`, `exit_ns`, `attached_mono_ns` (and
//! `call_blocks`' `min_ts_ns`, `max_ts_ns`); tasks `pid`, `tid`, `ppid`;
//! references `call_id`, `wait_id`, `stack_id` (and `call_blocks`'
//! `first_id`, `last_id`).
//!
//! Stack ids are not row ids: they are the kernel's 64-bit hashes of a
//! process's frames, named by `stacks.id` and by every `stack_id` column
//! (`call_rows`, `allocator_rows`, `stack_frames`). An input's id is kept
//! unless the merged file already uses it (another node's stack, or an id
//! another node's calls name without a stored stack); then it and every
//! reference to it in that input move to a fresh id ([`StackPlan`]). Two
//! nodes' stacks are never one: the kernel hashes the pid with the frames,
//! and pids that collide are moved, so the same id from two nodes is two
//! processes' stacks (or one file given twice).

use crate::error::{SqlContext, StoreError};
use crate::open::{has_table, open_untrusted};
use crate::problems::MAX_NS;
use crate::schema;
use crate::types::{MergeNode, TraceSource};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

const TIME_COLS: &[&str] = &[
    "ts_ns",
    "start_ns",
    "end_ns",
    "off_ns",
    "wake_ns",
    "on_ns",
    "exit_ns",
    "attached_mono_ns",
];
const TASK_COLS: &[&str] = &["pid", "tid", "ppid"];
/// Times of `call_blocks` (its calls' earliest and latest start).
const BLOCK_TIME_COLS: &[&str] = &["min_ts_ns", "max_ts_ns"];
/// Stored columns of version 6 and how a version 5 source gives them.
fn derived_columns() -> [(&'static str, String); 4] {
    [
        ("pid_gap", "tid - pid".into()),
        ("kind_id", crate::schema::wait_kind_case("kind", false)),
        ("blocked_for", "wake_ns - off_ns".into()),
        ("runnable_for", "on_ns - wake_ns".into()),
    ]
}
/// Written by the merge itself, not copied (`ops` is filled by the schema;
/// calls are copied through the `calls` view or table by `copy_calls`).
const OWN_TABLES: &[&str] = &[
    "meta",
    "session",
    "stats",
    "merge_nodes",
    "process_nodes",
    "ops",
    "call_rows",
    "calls",
];

/// One input and how its rows move.
#[derive(Debug, Clone)]
pub struct MergeInput {
    pub path: PathBuf,
    pub shift_ns: i64,
    pub pid_offset: u32,
    pub skew_ns: i64,
    pub skew_applied: bool,
    pub skew_samples: usize,
    pub skew_spread_ns: Option<i64>,
}

/// What an input holds that the merge plan needs: its session and its task ids.
#[derive(Debug, Clone)]
pub struct InputFacts {
    pub hostname: String,
    pub realtime_offset_ns: i64,
    pub pids: BTreeSet<u32>,
    /// Why the file cannot be merged as it is when its tracer did not
    /// complete it (still writing it, or killed); None for a complete
    /// file. The caller words the refusal (it can tell a live tracer from a
    /// dead one); [`write_merged`] refuses such a file too.
    pub unfinished: Option<String>,
}

/// Why `t` is not a complete trace, if it is not: a file its tracer did
/// not complete (still writing it, or killed before its completion) has
/// no rollups, and for a file of this schema version `gpusleuth finish`
/// completes it; an older version's file with neither rollups nor a
/// session end (older tracers wrote no rollups) cannot be completed by
/// this build. Merged as it is, such a file's session has no
/// end (the merged windows would end before its calls) and its
/// kernel-counted launches are only in its samples, never in its counts:
/// they would be lost.
pub(crate) fn unfinished(t: &crate::Trace) -> Result<Option<String>, StoreError> {
    if t.has_rollups()? {
        return Ok(None);
    }
    if t.version() == schema::SCHEMA_VERSION {
        return Ok(Some(format!(
            "is not finished (its tracer is still writing it, or stopped before completing it: \
             killed?): `gpusleuth finish --db {}` completes it, then merge it",
            t.path().display()
        )));
    }
    if t.session()?.end_mono_ns.is_some() {
        return Ok(None);
    }
    Ok(Some(format!(
        "is not finished (its tracer stopped before completing it) and was written by an older \
         gpusleuth (schema version {}), whose files `gpusleuth finish` cannot complete: \
         it cannot be merged",
        t.version()
    )))
}

/// Reads an input's session and pids; refuses non-gpusleuth and already-merged traces.
pub fn input_facts(path: &Path) -> Result<InputFacts, StoreError> {
    let t = crate::Trace::open(path)?;
    if t.source() != TraceSource::Gpusleuth {
        return Err(StoreError::file(
            path,
            "only traces recorded by gpusleuth can be merged (this one was imported)",
        ));
    }
    if !t.merge_nodes()?.is_empty() {
        return Err(StoreError::file(path, "is already a merged trace"));
    }
    let s = t.session()?;
    Ok(InputFacts {
        hostname: s.info.hostname,
        realtime_offset_ns: s.info.realtime_offset_ns,
        pids: t.pids()?.into_iter().collect(),
        unfinished: unfinished(&t)?,
    })
}

/// Writes the merged database at `out` (mode 0600; an existing file is
/// replaced only with `overwrite`, never an input nor anything but a
/// regular file). The first input's session is the merged session (its
/// clock is the merged clock).
///
/// The merge is written to a hidden file beside `out` and renamed into
/// place once complete (as `export` and `import` write theirs): a merge
/// that fails leaves `out` as it was, where `--force` removed it first and
/// a failed merge then lost it (round 51), and leaves nothing of its own.
pub fn write_merged(
    inputs: &[MergeInput],
    out: &Path,
    overwrite: bool,
    tool_version: &str,
) -> Result<Vec<MergeNode>, StoreError> {
    let paths: Vec<&Path> = inputs.iter().map(|i| i.path.as_path()).collect();
    crate::outfile::check_output(out, &paths, overwrite, None)?;
    let tmp = crate::outfile::temp_path_for(out);
    // Errors name the output asked for: the hidden name is ours.
    let result = crate::writer::create_private_file(&tmp, false)
        .map_err(|e| match e {
            StoreError::Io { source, .. } => StoreError::io(out, source),
            other => other,
        })
        .and_then(|()| write_into(inputs, &tmp, out, tool_version))
        .and_then(|nodes| publish(&tmp, out, overwrite).map(|()| nodes));
    if result.is_err() {
        crate::outfile::remove_database(&tmp);
    }
    result
}

/// Renames the complete merge `tmp` to `out`. An old output's SQLite side
/// files go first: a `-wal` or hot `-journal` left beside the new file
/// would be applied to it by its next reader, pages of another database.
/// Only now, with the merge complete, is anything of the old output removed.
fn publish(tmp: &Path, out: &Path, overwrite: bool) -> Result<(), StoreError> {
    if overwrite {
        for suffix in crate::outfile::SQLITE_SIDE_FILES {
            let mut side = out.as_os_str().to_owned();
            side.push(suffix);
            let side = PathBuf::from(side);
            // Never a device, a pipe or a link under that name.
            crate::outfile::ensure_replaceable(&side)?;
            match std::fs::remove_file(&side) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StoreError::io(&side, e))
                }
                _ => {}
            }
        }
    }
    crate::outfile::publish(tmp, out, overwrite, None)
}

/// Writes the merge into `file` (created empty), naming `out` in errors
/// (`file` is its hidden temporary name).
fn write_into(
    inputs: &[MergeInput],
    file: &Path,
    out: &Path,
    tool_version: &str,
) -> Result<Vec<MergeNode>, StoreError> {
    let mut dst = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .at(out)?;
    let tx = dst.transaction().at(out)?;
    schema::create(&tx, TraceSource::Gpusleuth.as_str(), tool_version).at(out)?;
    let dst_tables = table_names(&tx).at(out)?;
    let mut stats: BTreeMap<String, i64> = BTreeMap::new();
    let mut nodes = Vec::new();
    let (mut start, mut end): (Option<i64>, Option<i64>) = (None, None);
    // Every stack id the merged file uses so far (stored or only named).
    let mut stack_ids: HashSet<i64> = HashSet::new();
    for (i, input) in inputs.iter().enumerate() {
        let p = &input.path;
        // Where the input ends: its session end, or for a file `gpusleuth
        // finish` completed (its tracer was killed: no end recorded) its
        // calls' latest end, as its readers take it; an unfinished file is
        // refused (see [`unfinished`]).
        let input_end = {
            let t = crate::Trace::open(p)?;
            if let Some(why) = unfinished(&t)? {
                return Err(StoreError::file(p, why));
            }
            t.start_and_end()?.1
        };
        let src = open_untrusted(&input.path)?;
        let session = read_session(&src).at(p)?;
        if i == 0 {
            copy_session(&src, &tx).at(out)?;
            // The merged clock is the first input's, base and all.
            let base = crate::file_clock::stored_clock_base_of(&src, p)?;
            tx.execute(
                "INSERT INTO meta(key, value) VALUES ('clock_base_ns', ?1)",
                [base.to_string()],
            )
            .at(out)?;
        }
        // A clock moved back past its own zero (only seen with synthetic
        // timestamps: a real session starts long after boot) starts at 0, as
        // readers refuse negative times.
        // An end moved past the readers' range is refused as the rows are
        // (see `OutOfRange`).
        let moved = |t: i64, what: &str| match t.checked_add(input.shift_ns) {
            Some(m) if m <= MAX_NS => Ok(m.max(0)),
            _ => Err(OutOfRange {
                what: what.to_string(),
                ns: t,
            }
            .error(p, input.shift_ns)),
        };
        let s0 = moved(session.start_mono_ns, "session.start_mono_ns")?;
        start = Some(start.map_or(s0, |v| v.min(s0)));
        let e = moved(
            i64::try_from(input_end).unwrap_or(i64::MAX),
            "the session's end",
        )?;
        end = Some(end.map_or(e, |v| v.max(e)));
        // Ids of the tables others refer to, fixed before this node's rows go in.
        let mut id_offsets = BTreeMap::new();
        id_offsets.insert("calls", max_id(&tx, "call_rows").at(out)?);
        id_offsets.insert("waits", max_id(&tx, "waits").at(out)?);
        let copied: Vec<String> = table_names(&src)
            .at(p)?
            .into_iter()
            .filter(|t| !OWN_TABLES.contains(&t.as_str()) && dst_tables.contains(t))
            .collect();
        let stacks = StackPlan::new(&src, i, &copied, &mut stack_ids).at(out)?;
        let moves = Moves {
            input,
            id_offsets: &id_offsets,
            stacks: &stacks,
        };
        let copy = |tables| match copy_table(&src, &tx, tables, &moves).at(out)? {
            Some(bad) => Err(bad.error(p, input.shift_ns)),
            None => Ok(()),
        };
        for table in &copied {
            copy((table, table))?;
        }
        // Both schema versions have `calls` with the op by name (a table in
        // version 1, a view in 2): op ids are this file's, not the input's.
        copy(("calls", "call_rows"))?;
        if has_table(&src, "stats").at(p)? {
            let mut st = src.prepare("SELECT name, value FROM stats").at(p)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .at(p)?;
            for r in rows {
                let (k, v) = r.at(p)?;
                match k.as_str() {
                    // Each node had its own tracer: the merged trace names
                    // none, and its readers know the tracers by their
                    // names (`threads::is_tracer`). A sum of pids named
                    // some process, or none, as the tracer.
                    sleuth_core::threads::TRACER_PID_STAT => {}
                    // The room left in a node's kernel maps: the tightest;
                    // a probe trap's cost: the cheapest node's (the verdicts
                    // take out no more than any node's traps cost).
                    k if sleuth_core::rollup::LAST_VALUE_STATS.contains(&k) => {
                        let e = stats.entry(k.to_string()).or_insert(v);
                        *e = (*e).min(v);
                    }
                    _ => *stats.entry(k).or_default() += v,
                }
            }
        }
        let node = MergeNode {
            node: i as i64,
            hostname: session.hostname.clone(),
            source: input.path.display().to_string(),
            realtime_offset_ns: session.realtime_offset_ns,
            shift_ns: input.shift_ns,
            skew_ns: input.skew_ns,
            skew_applied: input.skew_applied,
            skew_samples: input.skew_samples as i64,
            skew_spread_ns: input.skew_spread_ns,
            pid_offset: input.pid_offset as i64,
        };
        tx.execute(
            "INSERT INTO merge_nodes(node, hostname, source, realtime_offset_ns, shift_ns, skew_ns,
                skew_applied, skew_samples, skew_spread_ns, pid_offset)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                node.node,
                node.hostname,
                node.source,
                node.realtime_offset_ns,
                node.shift_ns,
                node.skew_ns,
                node.skew_applied,
                node.skew_samples,
                node.skew_spread_ns,
                node.pid_offset
            ],
        )
        .at(out)?;
        for pid in crate::reader::pids_of(&src).at(p)? {
            // Moved past 2^32 it would wrap onto another node's pid.
            let Some(moved) = pid.checked_add(input.pid_offset) else {
                return Err(StoreError::file(
                    p,
                    format!(
                        "pid {pid} cannot be moved by {} (past 2^32)",
                        input.pid_offset
                    ),
                ));
            };
            tx.execute(
                "INSERT OR REPLACE INTO process_nodes(pid, node, host, host_pid) VALUES (?1, ?2, ?3, ?4)",
                params![moved, i as i64, session.hostname, pid],
            )
            .at(out)?;
        }
        nodes.push(node);
    }
    for (k, v) in &stats {
        tx.execute(
            "INSERT INTO stats(name, value) VALUES (?1, ?2)
             ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            params![k, v],
        )
        .at(out)?;
    }
    tx.execute(
        "UPDATE session SET start_mono_ns = coalesce(?1, start_mono_ns), end_mono_ns = ?2,
            command = 'merge of ' || ?3 || ' traces: ' || command WHERE id = 1",
        params![start, end, inputs.len() as i64],
    )
    .at(out)?;
    tx.commit().at(out)?;
    Ok(nodes)
}

struct SessionRow {
    start_mono_ns: i64,
    realtime_offset_ns: i64,
    hostname: String,
}

fn read_session(c: &Connection) -> rusqlite::Result<SessionRow> {
    c.query_row(
        "SELECT start_mono_ns, realtime_offset_ns, hostname FROM session WHERE id = 1",
        [],
        |r| {
            Ok(SessionRow {
                start_mono_ns: r.get(0)?,
                realtime_offset_ns: r.get(1)?,
                hostname: r.get(2)?,
            })
        },
    )
}

fn copy_session(src: &Connection, dst: &Connection) -> rusqlite::Result<()> {
    let cols = "id, started_unix_ns, start_mono_ns, end_mono_ns, realtime_offset_ns, hostname, \
                kernel, command, target, launch_mode, tool_version";
    let row: Vec<Value> = src.query_row(
        &format!("SELECT {cols} FROM session WHERE id = 1"),
        [],
        |r| (0..11).map(|i| r.get::<_, Value>(i)).collect(),
    )?;
    dst.execute(
        &format!(
            "INSERT INTO session({cols}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        rusqlite::params_from_iter(row),
    )?;
    Ok(())
}

fn table_names(c: &Connection) -> rusqlite::Result<BTreeSet<String>> {
    let mut st = c.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    )?;
    let rows = st.query_map([], |r| r.get::<_, String>(0))?;
    rows.collect()
}

fn max_id(c: &Connection, table: &str) -> rusqlite::Result<i64> {
    c.query_row(
        &format!("SELECT coalesce(max(id), 0) FROM {table}"),
        [],
        |r| r.get(0),
    )
}

fn columns(c: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut st = c.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let rows = st.query_map([], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// A time of an input, valid as it was (in 0..=2^62 ns, the readers'
/// range), that its shift onto the first input's clock moves outside that
/// range: written, every reader would skip its row as damage (times moved
/// below 0 were written so, round 51). The input's clock does not match the
/// first's (another job's trace, a wrong wall clock): the merge is refused.
struct OutOfRange {
    /// `table.column`, or what else it is.
    what: String,
    ns: i64,
}

impl OutOfRange {
    fn error(&self, input: &Path, shift_ns: i64) -> StoreError {
        let moved = i128::from(self.ns) + i128::from(shift_ns);
        StoreError::file(
            input,
            format!(
                "its times moved onto the first trace's clock (by {shift_ns} ns, from the \
                 sessions' wall-clock offsets and the measured skew) leave the readers' range \
                 0..2^62 ns ({} {} ns becomes {moved} ns): its clock does not match the first \
                 trace's (another job's trace, or a wrong wall clock)",
                self.what, self.ns
            ),
        )
    }
}

/// How one input's rows move: its shifts, where its row ids continue, and
/// its stack ids.
struct Moves<'a> {
    input: &'a MergeInput,
    id_offsets: &'a BTreeMap<&'static str, i64>,
    stacks: &'a StackPlan,
}

/// One input's stack ids that move in the merged file (to a fresh id,
/// where the merged file already uses theirs); the others stay as they are.
#[derive(Default)]
struct StackPlan {
    moved: HashMap<i64, i64>,
}

impl StackPlan {
    /// Plans the stack ids of input number `node` (`copied`: its tables that
    /// are copied; `in_use`: every stack id the merged file uses so far,
    /// which gets this input's).
    fn new(
        src: &Connection,
        node: usize,
        copied: &[String],
        in_use: &mut HashSet<i64>,
    ) -> rusqlite::Result<StackPlan> {
        let stored: BTreeSet<i64> = if has_table(src, "stacks")? {
            int_column(src, "SELECT id FROM stacks WHERE typeof(id) = 'integer'")?
        } else {
            BTreeSet::new()
        };
        // The ids the input's rows name, its stored stacks' or not (a stack
        // lost in the ring names no row: it must not come to name another
        // node's stack, nor another node's lost one to name this one's).
        let mut named = stored.clone();
        let calls = if has_table(src, "call_rows")? {
            "call_rows"
        } else {
            "calls"
        };
        for table in copied.iter().map(String::as_str).chain([calls]) {
            if columns(src, table)?.iter().any(|c| c == "stack_id") {
                named.extend(int_column(
                    src,
                    &format!(
                        "SELECT DISTINCT stack_id FROM {table}
                         WHERE stack_id IS NOT NULL AND typeof(stack_id) = 'integer'"
                    ),
                )?);
            }
        }
        let mut plan = StackPlan::default();
        let mut fresh_taken: HashSet<i64> = HashSet::new();
        for &id in &named {
            if !in_use.contains(&id) {
                continue;
            }
            // A fresh id no one uses: not the merged file's, not one this
            // input names, not one given to another of its ids. Derived
            // from the old id and the node, so a merge gives the same file
            // each time.
            let mut h = (id as u64) ^ (node as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let new = loop {
                h = splitmix64(h);
                let c = h as i64;
                if !in_use.contains(&c) && !named.contains(&c) && !fresh_taken.contains(&c) {
                    break c;
                }
            };
            fresh_taken.insert(new);
            plan.moved.insert(id, new);
        }
        in_use.extend(named.iter().map(|id| plan.id(*id)));
        Ok(plan)
    }

    /// The merged file's id for the input's stack `id`.
    fn id(&self, id: i64) -> i64 {
        self.moved.get(&id).copied().unwrap_or(id)
    }
}

/// SplitMix64's step: spreads the fresh stack ids over the 64-bit space
/// the kernel's hashes are in.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn int_column(c: &Connection, sql: &str) -> rusqlite::Result<BTreeSet<i64>> {
    let mut st = c.prepare(sql)?;
    let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
    rows.collect()
}

/// Copies the columns both sides have from `src_table` to `dst_table`,
/// moving times, tasks and ids. Into `call_rows`, the source's op name
/// becomes this file's op id (see [`op_id`]). Stops at the first valid time
/// the shift moves out of the readers' range, and returns it.
fn copy_table(
    src: &Connection,
    dst: &Connection,
    (src_table, dst_table): (&str, &str),
    moves: &Moves,
) -> rusqlite::Result<Option<OutOfRange>> {
    let (input, id_offsets) = (moves.input, moves.id_offsets);
    let dst_cols: BTreeSet<String> = columns(dst, dst_table)?.into_iter().collect();
    let cols: Vec<String> = columns(src, src_table)?
        .into_iter()
        .filter(|c| dst_cols.contains(c))
        .collect();
    let by_name = dst_table == "call_rows";
    if cols.is_empty() {
        return Ok(None);
    }
    // Row ids continue after the rows already there (other nodes'); a
    // stack's id is its hash, not a row id (moved by the plan alone).
    let own_id = if dst_table != "stacks" && cols.iter().any(|c| c == "id") {
        max_id(dst, dst_table)?
    } else {
        0
    };
    // Columns this file stores that an older source computes from others
    // (a version 6 file from a version 5 one, `derived_columns`): a
    // thread's distance to its process (moved with both), a wait's kind as
    // a number and its blocked and runnable times (differences: not moved).
    let derived: Vec<(&str, String)> = derived_columns()
        .into_iter()
        .filter(|(c, _)| dst_cols.contains(*c) && !cols.iter().any(|s| s == c))
        .collect();
    let stack_id = |v| match v {
        Value::Integer(i) => Value::Integer(moves.stacks.id(i)),
        other => other,
    };
    // The first valid time moved out of range (its column, its value).
    let out_of_range: Cell<Option<(&str, i64)>> = Cell::new(None);
    let mut map: Vec<Box<dyn Fn(Value) -> Value + '_>> = cols
        .iter()
        .map(|c| -> Box<dyn Fn(Value) -> Value + '_> {
            let shift = input.shift_ns;
            let out_of_range = &out_of_range;
            let pid_off = i64::from(input.pid_offset);
            let add = |by: i64| -> Box<dyn Fn(Value) -> Value> {
                Box::new(move |v| match v {
                    Value::Integer(i) => Value::Integer(i.saturating_add(by)),
                    other => other,
                })
            };
            // The writer's blocks of call rows (`call_blocks`): their id
            // ranges and earliest and latest starts move with the calls,
            // or a read keeping to them would look for a node's calls in
            // another node's rows and times.
            let blocks = dst_table == "call_blocks";
            match c.as_str() {
                "first_id" | "last_id" if blocks => {
                    add(id_offsets.get("calls").copied().unwrap_or(0))
                }
                c if TIME_COLS.contains(&c) || (blocks && BLOCK_TIME_COLS.contains(&c)) => {
                    Box::new(move |v| match v {
                        Value::Integer(t) if (0..=MAX_NS).contains(&t) => {
                            match t.checked_add(shift) {
                                Some(m) if (0..=MAX_NS).contains(&m) => Value::Integer(m),
                                _ => {
                                    out_of_range.set(Some((c, t)));
                                    Value::Integer(t)
                                }
                            }
                        }
                        // A time readers skip already (damage) stays one.
                        Value::Integer(t) => Value::Integer(t.saturating_add(shift)),
                        other => other,
                    })
                }
                // Task 0 is the idle task: the same on every node.
                c if TASK_COLS.contains(&c) => Box::new(move |v| match v {
                    // A crafted value near 2^63 saturates (readers skip
                    // a task id past 2^32) rather than overflow.
                    Value::Integer(i) if i != 0 => Value::Integer(i.saturating_add(pid_off)),
                    other => other,
                }),
                "id" if dst_table == "stacks" => Box::new(stack_id),
                "stack_id" => Box::new(stack_id),
                "id" => add(own_id),
                "call_id" => add(id_offsets.get("calls").copied().unwrap_or(0)),
                "wait_id" => add(id_offsets.get("waits").copied().unwrap_or(0)),
                _ => Box::new(|v| v),
            }
        })
        .collect();
    map.extend(
        derived
            .iter()
            .map(|_| -> Box<dyn Fn(Value) -> Value + '_> { Box::new(|v| v) }),
    );
    // The columns copied, then the derived ones: by name (inserted) or
    // by how the source gives them (selected).
    let listed = |derived_as: fn(&(&str, String)) -> String| {
        cols.iter()
            .cloned()
            .chain(derived.iter().map(derived_as))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (list, sel) = (listed(|d| d.0.to_string()), listed(|d| d.1.clone()));
    let read = map.len();
    let n = read + usize::from(by_name);
    let marks: Vec<String> = (1..=n).map(|i| format!("?{i}")).collect();
    let (ins_list, sel_list) = if by_name {
        (format!("{list}, op_id"), format!("{sel}, layer, op"))
    } else {
        (list, sel)
    };
    let mut ins = dst.prepare(&format!(
        "INSERT INTO {dst_table}({ins_list}) VALUES ({})",
        marks.join(", ")
    ))?;
    let mut sel = src.prepare(&format!("SELECT {sel_list} FROM {src_table}"))?;
    let mut rows = sel.query([])?;
    while let Some(r) = rows.next()? {
        let mut vals = Vec::with_capacity(n);
        for (i, f) in map.iter().enumerate() {
            vals.push(f(r.get::<_, Value>(i)?));
        }
        if let Some((column, ns)) = out_of_range.get() {
            return Ok(Some(OutOfRange {
                what: format!("{src_table}.{column}"),
                ns,
            }));
        }
        if by_name {
            let layer: String = r.get(read)?;
            let op: String = r.get(read + 1)?;
            vals.push(Value::Integer(op_id(dst, &layer, &op)?));
        }
        ins.execute(rusqlite::params_from_iter(vals))?;
    }
    Ok(None)
}

/// The id of op `name` in the merged file's `ops`: the op table's for ops
/// this build knows (`schema::create` stored them all), else a row added
/// for it, so a name this build does not know is kept (and counted by
/// readers) as it was in the input.
fn op_id(dst: &Connection, layer: &str, name: &str) -> rusqlite::Result<i64> {
    if let Some(info) = sleuth_core::op_by_name(name) {
        return Ok(i64::from(info.id));
    }
    let known: Option<i64> = dst
        .prepare_cached("SELECT id FROM ops WHERE op = ?1 AND layer = ?2")?
        .query_row([name, layer], |r| r.get(0))
        .optional()?;
    if let Some(id) = known {
        return Ok(id);
    }
    dst.prepare_cached("INSERT INTO ops(layer, op) VALUES (?1, ?2)")?
        .execute([layer, name])?;
    Ok(dst.last_insert_rowid())
}
