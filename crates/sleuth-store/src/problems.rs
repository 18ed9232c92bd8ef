//! Rows a reader cannot use, counted so that no command stays silent about them.
//!
//! A damaged or crafted trace may hold negative or absurd times and sizes
//! (a negative `dur_ns` used to print as 18446744073.7 s) and op names this
//! build does not know (they used to vanish, and `explain` then called the
//! trace clean). Readers skip such rows; [`InputProblems`] says how many,
//! and every command reports it.

use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use sleuth_core::op_by_name;
use std::collections::BTreeMap;

/// Largest time or duration a row may hold, in ns (2^62 ns is 146 years):
/// above it, or below 0, a value can only come from damage, and sums of
/// valid values cannot overflow 64 bits.
pub(crate) const MAX_NS: i64 = 1 << 62;

/// A time stored by a writer (a stored aggregate's moment), as a reader
/// accepts it: in 0..=[`MAX_NS`]; None for any other value.
pub(crate) fn stored_time(v: i64) -> Option<u64> {
    u64::try_from(v).ok().filter(|&t| t <= MAX_NS as u64)
}
/// Largest byte count a call may carry (1 PiB).
pub(crate) const MAX_SIZE: i64 = 1 << 50;
/// Characters of a process name read (Linux keeps 15): a crafted 70k-character
/// name repeated on every culprit row would otherwise make outputs explode.
pub(crate) const COMM_CHARS: i64 = 64;

/// SQL condition a `calls` row (optionally prefixed) must meet to be read.
pub(crate) fn valid_call(prefix: &str) -> String {
    let p = prefix;
    // `+ts_ns`: unary plus leaves the value as it is but keeps SQLite from
    // taking this bound (every valid time) as the `(tid, ts_ns)` index's
    // range, where a window's own bounds must be: a 1 ms window of a
    // 10M-call trace read every row of its threads (0.7 s instead of 1 ms).
    format!(
        "(+{p}ts_ns BETWEEN 0 AND {MAX_NS} AND {p}dur_ns BETWEEN 0 AND {MAX_NS} \
         AND {p}runnable_ns BETWEEN 0 AND {MAX_NS} AND {p}blocked_ns BETWEEN 0 AND {MAX_NS} \
         AND ({p}size IS NULL OR {p}size BETWEEN 0 AND {MAX_SIZE}) AND {})",
        task_ids(p, &["pid", "tid", "cpu"])
    )
}

/// SQL condition that columns `cols` (prefixed) hold 32-bit unsigned
/// integers, as the readers decode them: a crafted value outside them (a
/// version 6 row's pid is computed from two stored numbers) made readers
/// fail on a decode error instead of skipping the row (round 48).
fn task_ids(p: &str, cols: &[&str]) -> String {
    let one = |c: &&str| format!("{p}{c} BETWEEN 0 AND {}", u32::MAX);
    cols.iter().map(one).collect::<Vec<_>>().join(" AND ")
}

/// [`valid_call`] of a call row as `rows::call_from_row` decodes it (each
/// integer column read as i64 and cast: a negative value is past every
/// bound here, as it is outside `BETWEEN 0 AND ...` there; its pid, tid
/// and CPU were decoded as 32-bit ids, or the row not at all).
pub(crate) fn call_is_valid(c: &sleuth_core::CallEvent) -> bool {
    let ns = |v: u64| v <= MAX_NS as u64;
    ns(c.ts_ns)
        && ns(c.dur_ns)
        && ns(c.runnable_ns)
        && ns(c.blocked_ns)
        && c.size.is_none_or(|s| s <= MAX_SIZE as u64)
}

/// SQL condition a `waits` row (prefixed) must meet to be read (`+on_ns`:
/// as `+ts_ns` in [`valid_call`], for the `(tid, on_ns)` index).
pub(crate) fn valid_wait(prefix: &str) -> String {
    let p = prefix;
    format!(
        "({p}off_ns BETWEEN 0 AND {MAX_NS} AND {p}wake_ns BETWEEN 0 AND {MAX_NS} \
         AND +{p}on_ns BETWEEN 0 AND {MAX_NS} AND {})",
        task_ids(p, &["pid", "tid", "cpu"])
    )
}

/// Why a file whose valid call durations or sizes add up past 2^62 is
/// refused (every reader that reads its call rows says the same).
pub(crate) const TOTALS_OVERFLOW: &str =
    "damaged trace: call durations or sizes add up past 2^62 (no total read from it could be right)";

/// Unknown op names kept by name; the rest are only counted.
const NAMES_KEPT: usize = 20;
/// Characters of an unknown op name kept (a crafted name can be megabytes).
const NAME_CHARS: usize = 80;

/// What a reader skipped, by kind. Empty for every trace gpusleuth wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputProblems {
    /// Calls (and kernel-counted ops, allocator events) whose op name this
    /// build does not know, by name (shortened; at most 20 names).
    pub unknown_ops: BTreeMap<String, u64>,
    /// Rows with unknown op names beyond the names kept.
    pub unknown_ops_other: u64,
    /// Calls with a negative or impossible time, duration or size (or a
    /// pid, tid or CPU that is none).
    pub impossible_calls: u64,
    /// Scheduler waits with a negative or impossible timestamp, or an unknown kind.
    pub impossible_waits: u64,
}

impl InputProblems {
    /// Adds another file's skipped rows (a run's files, one answer).
    pub fn add(&mut self, other: InputProblems) {
        for (name, n) in other.unknown_ops {
            let e = self.unknown_ops.entry(name).or_default();
            *e = e.saturating_add(n);
        }
        self.unknown_ops_other = self
            .unknown_ops_other
            .saturating_add(other.unknown_ops_other);
        self.impossible_calls = self.impossible_calls.saturating_add(other.impossible_calls);
        self.impossible_waits = self.impossible_waits.saturating_add(other.impossible_waits);
    }

    pub fn is_empty(&self) -> bool {
        self.unknown_ops.is_empty()
            && self.unknown_ops_other == 0
            && self.impossible_calls == 0
            && self.impossible_waits == 0
    }

    /// Rows skipped because of unknown op names.
    pub fn unknown_op_rows(&self) -> u64 {
        // Saturating: a run adds up its files' counts.
        self.unknown_ops
            .values()
            .fold(self.unknown_ops_other, |n, &c| n.saturating_add(c))
    }

    /// One line per kind of problem, for a person (untrusted names inside:
    /// escape before printing to a terminal).
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.impossible_calls > 0 {
            out.push(format!(
                "{} calls skipped: negative or impossible time, duration or size (damaged input)",
                self.impossible_calls
            ));
        }
        if self.impossible_waits > 0 {
            out.push(format!(
                "{} scheduler waits skipped: negative or impossible timestamps or unknown kind (damaged input)",
                self.impossible_waits
            ));
        }
        let unknown = self.unknown_op_rows();
        if unknown > 0 {
            let mut names: Vec<String> = self
                .unknown_ops
                .iter()
                .map(|(n, c)| format!("{n:?} ×{c}"))
                .collect();
            if self.unknown_ops_other > 0 {
                names.push(format!("others ×{}", self.unknown_ops_other));
            }
            out.push(format!(
                "{unknown} rows skipped: op names this build does not know ({})",
                names.join(", ")
            ));
        }
        out
    }

    fn add_unknown(&mut self, name: &str, n: u64) {
        if self.unknown_ops.len() < NAMES_KEPT || self.unknown_ops.contains_key(name) {
            let short: String = name.chars().take(NAME_CHARS).collect();
            let key = if short.len() < name.len() {
                format!("{short}…")
            } else {
                short
            };
            *self.unknown_ops.entry(key).or_insert(0) += n;
        } else {
            self.unknown_ops_other += n;
        }
    }
}

/// The table holding the call rows' times and sizes in a trace of schema
/// `version` (the columns `valid_call` names): scans of version 2 read
/// `call_rows` without joining each row to its op name.
pub(crate) fn call_table(version: i64) -> &'static str {
    if version == 1 {
        "calls"
    } else {
        "call_rows"
    }
}

/// The queries that count rows by op name, in the order their names are
/// kept (`InputProblems::add_unknown` keeps the first 20): the call rows
/// (per op id in version 2), `op_counts`, then `allocator_events` when the
/// file has it. Each gives `(name, rows)`.
pub(crate) fn op_name_queries(version: i64, has_allocator_events: bool) -> Vec<String> {
    // Grouping by a substring keeps a megabyte-long crafted name from
    // being copied out whole.
    let by_name =
        |table: &str| format!("SELECT substr(op, 1, 200), count(*) FROM {table} GROUP BY op");
    // Per op id, then the name; an id `ops` does not hold is a row the
    // view over the table drops: counted as an unknown op.
    let by_id = |table: &str| {
        format!(
            "SELECT coalesce(substr(o.op, 1, 200), 'op id ' || g.op_id), g.n
             FROM (SELECT op_id, count(*) AS n FROM {table} GROUP BY op_id) g
             LEFT JOIN ops o ON o.id = g.op_id"
        )
    };
    let mut counts = Vec::new();
    if version == 1 {
        counts.push(by_name("calls"));
    } else {
        // The call rows' op index answers.
        counts.push(by_id("call_rows"));
    }
    counts.push(by_name("op_counts"));
    if has_allocator_events {
        counts.push(match version {
            ..=2 => by_name("allocator_events"),
            _ => by_id("allocator_rows"),
        });
    }
    counts
}

/// Rows of one [`op_name_queries`] query.
pub(crate) type OpRows = Vec<(String, u64)>;

/// Runs one of [`op_name_queries`].
pub(crate) fn op_rows(conn: &Connection, sql: &str) -> rusqlite::Result<OpRows> {
    let mut st = conn.prepare(sql)?;
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64));
    }
    Ok(out)
}

/// The waits readers skip: every wait minus those readers read (valid
/// times, a kind this build knows): each skipped row once, NULLs included,
/// in one pass without a sort (a `GROUP BY kind` sorted 2.3M rows: 0.9 s
/// against 0.3 s).
pub(crate) fn bad_waits(conn: &Connection) -> rusqlite::Result<u64> {
    let n = conn.query_row(
        &format!(
            "SELECT (SELECT count(*) FROM waits) - count(*) FROM waits WHERE {} AND kind IN ({})",
            valid_wait(""),
            known_wait_kinds()
        ),
        [],
        |r| r.get::<_, i64>(0),
    )?;
    Ok(n.max(0) as u64)
}

/// The skipped-row counts from the rows of [`op_name_queries`] (in their
/// order), the call-row pass and the skipped waits.
pub(crate) fn problems_of(op_rows: &[OpRows], calls: CallScan, bad_waits: u64) -> InputProblems {
    let mut p = InputProblems::default();
    for (name, n) in op_rows.iter().flatten() {
        if op_by_name(name).is_none() {
            p.add_unknown(name, *n);
        }
    }
    p.impossible_calls = calls.impossible;
    p.impossible_waits = bad_waits;
    p
}

/// Counts the rows readers skip on one connection, one query after the
/// other (`check_plan` runs the same queries side by side for readers).
/// `version`: the schema version; `has_allocator_events`: whether that
/// table exists.
#[cfg(test)]
pub(crate) fn scan(
    conn: &Connection,
    version: i64,
    has_allocator_events: bool,
    known: Option<CallScan>,
) -> rusqlite::Result<(InputProblems, CallScan)> {
    let rows = op_name_queries(version, has_allocator_events)
        .iter()
        .map(|sql| op_rows(conn, sql))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let calls = match known {
        Some(c) => c,
        None => call_scan(conn, version)?,
    };
    Ok((problems_of(&rows, calls, bad_waits(conn)?), calls))
}

/// The wait kinds this build reads, as an SQL list of string literals.
fn known_wait_kinds() -> String {
    use sleuth_core::WaitKind;
    [WaitKind::Preempted, WaitKind::Blocked]
        .iter()
        .map(|k| format!("'{}'", k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one pass over the call rows inside SQLite gives: the rows no
/// reader uses (impossible values) and whether the valid rows' durations or
/// sizes add up past 2^62 (the file is then refused as damaged). Made once
/// per file and shared (`checked::Checks`): a stream's totals check and the
/// count of skipped rows after the reads are one pass over a 10M-call file
/// (1.3 s), not two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallScan {
    pub impossible: u64,
    pub totals_overflow: bool,
}

/// The valid call rows of part of the table: how many, and their
/// durations' and sizes' totals (SQLite's `total()`, a float: a sum of
/// valid values cannot overflow it, and the refusal is "past 2^62").
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CallSums {
    pub valid: u64,
    pub dur: f64,
    pub size: f64,
}

impl CallSums {
    pub(crate) fn add(&mut self, o: CallSums) {
        self.valid += o.valid;
        self.dur += o.dur;
        self.size += o.size;
    }

    /// The pass's verdict, given every row of the table (`rows`).
    pub(crate) fn scan(&self, rows: u64) -> CallScan {
        CallScan {
            impossible: rows.saturating_sub(self.valid),
            totals_overflow: self.dur > MAX_NS as f64 || self.size > MAX_NS as f64,
        }
    }
}

/// The call rows of a trace of `version`, all of them (the table's
/// smallest b-tree answers).
pub(crate) fn call_rows(conn: &Connection, version: i64) -> rusqlite::Result<u64> {
    let n: i64 = conn.query_row(
        &format!("SELECT count(*) FROM {}", call_table(version)),
        [],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as u64)
}

/// [`CallSums`] of the call rows whose rowid is in `ids` (inclusive), or
/// of every row (None). The condition is tested once per row in `WHERE`
/// (as a `CASE` in each aggregate it ran three times: 2.9 s against 1.5 s
/// on a 10M-call file); the rows without it are [`call_rows`] minus these.
pub(crate) fn call_sums(
    conn: &Connection,
    version: i64,
    ids: Option<(i64, i64)>,
) -> rusqlite::Result<CallSums> {
    let table = call_table(version);
    let range = if ids.is_some() {
        "rowid BETWEEN ?1 AND ?2 AND"
    } else {
        ""
    };
    let (lo, hi) = ids.unwrap_or((0, 0));
    let sql = format!(
        "SELECT count(*), total(dur_ns), total(size) FROM {table} WHERE {range} {}",
        valid_call("")
    );
    let mut st = conn.prepare(&sql)?;
    let params: &[&dyn rusqlite::ToSql] = if ids.is_some() { &[&lo, &hi] } else { &[] };
    st.query_row(params, |r| {
        Ok(CallSums {
            valid: r.get::<_, i64>(0)?.max(0) as u64,
            dur: r.get(1)?,
            size: r.get(2)?,
        })
    })
}

/// The smallest and largest rowid of the call rows, when the table can be
/// split into rowid ranges: a rowid table (not `WITHOUT ROWID`) where
/// `rowid` names the row id itself (no column of that name: the schema
/// check allows extra columns). None when it cannot, or has no rows.
pub(crate) fn call_rowids(conn: &Connection, version: i64) -> rusqlite::Result<Option<(i64, i64)>> {
    let table = call_table(version);
    let shadowed: i64 = conn.query_row(
        "SELECT count(*) FROM pragma_table_xinfo(?1) WHERE lower(name) = 'rowid'",
        [table],
        |r| r.get(0),
    )?;
    if shadowed > 0 {
        return Ok(None);
    }
    // A `WITHOUT ROWID` table has no rowid: the statement does not prepare.
    let Ok(mut st) = conn.prepare(&format!("SELECT min(rowid), max(rowid) FROM {table}")) else {
        return Ok(None);
    };
    st.query_row([], |r| {
        Ok(
            match (r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?) {
                (Some(lo), Some(hi)) => Some((lo, hi)),
                _ => None,
            },
        )
    })
}

/// Part `i` of `n` of the rowids `lo..=hi`: consecutive, together exactly
/// `lo..=hi`; None for an empty part (more parts than rowids).
pub(crate) fn rowid_part(lo: i64, hi: i64, i: usize, n: usize) -> Option<(i64, i64)> {
    let span = i128::from(hi) - i128::from(lo) + 1;
    let at = |k: usize| i128::from(lo) + span * k as i128 / n as i128;
    let (a, b) = (at(i), at(i + 1) - 1);
    (a <= b).then_some((a as i64, b as i64))
}

/// Counts the impossible call rows and sums the valid ones' durations and
/// sizes in one pass on one connection (`check_plan` splits the same pass
/// into rowid ranges run side by side).
#[cfg(test)]
pub(crate) fn call_scan(conn: &Connection, version: i64) -> rusqlite::Result<CallScan> {
    let rows = call_rows(conn, version)?;
    Ok(call_sums(conn, version, None)?.scan(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_counts_and_shorten_names() {
        let mut p = InputProblems::default();
        assert!(p.is_empty() && p.lines().is_empty());
        p.impossible_calls = 2;
        p.add_unknown(&"x".repeat(1000), 3);
        for i in 0..25 {
            p.add_unknown(&format!("op{i}"), 1);
        }
        assert_eq!(p.unknown_ops.len(), NAMES_KEPT);
        assert_eq!(p.unknown_op_rows(), 3 + 25);
        let lines = p.lines();
        assert!(lines[0].starts_with("2 calls skipped"), "{lines:?}");
        assert!(lines[1].starts_with("28 rows skipped"), "{lines:?}");
        assert!(lines[1].len() < 4000, "names are shortened");
    }

    /// A version-1 file holding only what `scan` reads, with these call and wait rows.
    fn file(calls: &[&str], waits: &[&str]) -> Connection {
        let c = Connection::open_in_memory().expect("db");
        c.execute_batch(
            "CREATE TABLE calls(id INTEGER PRIMARY KEY, op TEXT, ts_ns INTEGER, dur_ns INTEGER,
                 runnable_ns INTEGER, blocked_ns INTEGER, size INTEGER,
                 pid INTEGER DEFAULT 1, tid INTEGER DEFAULT 1, cpu INTEGER DEFAULT 0);
             CREATE TABLE op_counts(pid INTEGER, op TEXT, count INTEGER);
             CREATE TABLE waits(id INTEGER PRIMARY KEY, kind TEXT, off_ns INTEGER,
                 wake_ns INTEGER, on_ns INTEGER,
                 pid INTEGER DEFAULT 1, tid INTEGER DEFAULT 1, cpu INTEGER DEFAULT 0);",
        )
        .expect("schema");
        for v in calls {
            c.execute(&format!("INSERT INTO calls(op, ts_ns, dur_ns, runnable_ns, blocked_ns, size) VALUES ({v})"), [])
                .expect("call");
        }
        for v in waits {
            c.execute(
                &format!("INSERT INTO waits(kind, off_ns, wake_ns, on_ns) VALUES ({v})"),
                [],
            )
            .expect("wait");
        }
        c
    }

    fn counts(calls: &[&str], waits: &[&str]) -> (InputProblems, CallScan) {
        scan(&file(calls, waits), 1, false, None).expect("scan")
    }

    /// Each row readers skip is counted once, whatever is wrong with it
    /// (a wait with impossible times and an unknown kind used to count
    /// twice, one with a NULL time not at all), and only those.
    #[test]
    fn each_skipped_row_is_counted_once() {
        let ok = "'cudaMalloc', 10, 5, 0, 0, 4096";
        let wait = "'blocked', 1, 2, 3";
        let (p, c) = counts(&[ok, ok], &[wait, wait]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(
            c,
            CallScan {
                impossible: 0,
                totals_overflow: false
            }
        );
        let (p, c) = counts(
            &[
                ok,
                "'cudaMalloc', 10, -5, 0, 0, 4096",
                "'cudaMalloc', NULL, 5, 0, 0, 4096",
                "'cudaMalloc', 10, 5, 0, 0, 'x'",
                "'cudaMalloc', 10, 5, 0, 0, 1125899906842625",
            ],
            &[wait],
        );
        assert_eq!((p.impossible_calls, c.impossible), (4, 4));
        for (bad, why) in [
            ("'napping', -1, 2, 3", "impossible and of an unknown kind"),
            ("'blocked', 1, 2, NULL", "a NULL time"),
            ("'napping', 1, 2, 3", "an unknown kind"),
            ("'preempted', 1, 4611686018427387905, 3", "past 2^62"),
        ] {
            let (p, _) = counts(&[ok], &[wait, bad]);
            assert_eq!(p.impossible_waits, 1, "{why}");
        }
    }

    /// The totals are the valid rows': an impossible duration does not
    /// count, two valid ones past 2^62 together do.
    #[test]
    fn totals_overflow_counts_only_valid_rows() {
        let half = "'cudaMalloc', 10, 2305843009213693952, 0, 0, NULL";
        let (_, c) = counts(
            &[half, "'cudaMalloc', 10, 4611686018427387905, 0, 0, NULL"],
            &[],
        );
        assert_eq!(
            c,
            CallScan {
                impossible: 1,
                totals_overflow: false
            }
        );
        let (_, c) = counts(&[half, half, half], &[]);
        assert!(c.totals_overflow);
    }
}
