//! The site rollup (issue 16): device memory and recorded calls by call
//! site, per process, computed when the trace ends and read back by
//! `memory --by-site`, MCP `memory` and `call_sites` instead of holding
//! every memory call (1.25 million of a 10M-call trace: 300 MB, 30 s).
//!
//! [`write`] takes what each site allocated and what was live at each
//! process's peak from the completion's one replay of the memory calls
//! (`ledger_rollup::write`, [`Tallies`]) and groups the calls that carry a
//! site in SQL; [`stored`] rebuilds what
//! `sleuth_core::sites::memory_by_site` gives from the rows, labels from the
//! reader's stacks. Table and meaning: docs/schema.md, "Site rollup".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::problems::valid_call;
use rusqlite::{params, Connection};
use sleuth_core::ledger::LiveByStack;
use sleuth_core::sites::{label_of, AllocTally, SiteMemory};
use sleuth_core::{op_by_name, CallEvent, TraceData};
use std::collections::{BTreeMap, BTreeSet};

/// `meta.site_rollup` once both tables below are complete.
const COMPLETE: &str = "1";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS site_memory(pid INTEGER NOT NULL, stack_id INTEGER, first_ts_ns INTEGER NOT NULL, first_id INTEGER NOT NULL, allocs INTEGER NOT NULL, alloc_bytes INTEGER NOT NULL, unfreed INTEGER NOT NULL, unfreed_bytes INTEGER NOT NULL, at_peak_bytes INTEGER NOT NULL, failed INTEGER NOT NULL, failed_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS site_calls(pid INTEGER NOT NULL, stack_id INTEGER NOT NULL, op TEXT NOT NULL, calls INTEGER NOT NULL, errors INTEGER NOT NULL, total_ns INTEGER NOT NULL);";

const MEMORY_COLS: &[&str] = &[
    "pid",
    "stack_id",
    "first_ts_ns",
    "first_id",
    "allocs",
    "alloc_bytes",
    "unfreed",
    "unfreed_bytes",
    "at_peak_bytes",
    "failed",
    "failed_bytes",
];
const CALLS_COLS: &[&str] = &["pid", "stack_id", "op", "calls", "errors", "total_ns"];

/// One process's device memory of one stack (None: not captured).
#[derive(Debug, Clone, Default)]
struct Acc {
    /// The first allocation's start and row id: the example stack of a
    /// label is that of its first allocation, as `memory_by_site` picks it.
    first: (u64, i64),
    allocs: u64,
    alloc_bytes: u64,
    unfreed: u64,
    unfreed_bytes: u64,
    at_peak_bytes: u64,
    failed: u64,
    failed_bytes: u64,
}

/// Recorded calls of one site and op: how many, how many failed, their time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteCalls {
    pub calls: u64,
    pub errors: u64,
    pub total_ns: u64,
}

/// What each site allocated (and failed to), per process, from the
/// memory calls in any order: the ledger's replay hands them over
/// (`ledger_rollup::write`), so they are not read a second time.
#[derive(Debug, Default)]
pub(crate) struct Tallies(BTreeMap<(u32, Option<u64>), Acc>);

impl Tallies {
    /// One memory call (`id` its row id).
    pub(crate) fn add(&mut self, c: &CallEvent, id: i64) {
        // A device allocation (`AllocTally::of`: the by-site table's own rule).
        let Some(t) = AllocTally::of(c) else { return };
        let a = self.0.entry((c.pid, t.stack_id)).or_insert_with(|| Acc {
            first: (c.ts_ns, id),
            ..Default::default()
        });
        // The first in start order (ties by row id), whatever the order fed.
        a.first = a.first.min((c.ts_ns, id));
        if t.failed {
            a.failed += 1;
            a.failed_bytes = a.failed_bytes.saturating_add(t.bytes);
        } else {
            a.allocs += 1;
            a.alloc_bytes = a.alloc_bytes.saturating_add(t.bytes);
        }
    }
}

/// Stores the site rollup from what each site allocated (`tallies`), the
/// end ledgers (`ledgers`, as the ledger rollup stored them) and what each
/// process held per site at its peak (`at_peak`, from the same replay).
pub(crate) fn write(
    conn: &Connection,
    tallies: Tallies,
    ends: &[crate::ledger_rollup::LedgerEnd],
    at_peak: &BTreeMap<u32, LiveByStack>,
) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute("DELETE FROM site_memory", [])?;
    conn.execute("DELETE FROM site_calls", [])?;
    let mut acc = tallies.0;
    fn entry(
        acc: &mut BTreeMap<(u32, Option<u64>), Acc>,
        pid: u32,
        stack: Option<u64>,
    ) -> &mut Acc {
        acc.entry((pid, stack)).or_insert_with(|| Acc {
            first: (u64::MAX, i64::MAX),
            ..Default::default()
        })
    }
    for l in ends {
        for &(stack, bytes) in &l.unfreed {
            let a = entry(&mut acc, l.pid, stack);
            a.unfreed += 1;
            a.unfreed_bytes = a.unfreed_bytes.saturating_add(bytes);
        }
    }
    // What was live at each process's peak (`ledger(data, Some(peak))` of
    // that process, by site).
    for (pid, live) in at_peak {
        for (&stack, &bytes) in live {
            let a = entry(&mut acc, *pid, stack);
            a.at_peak_bytes = a.at_peak_bytes.saturating_add(bytes);
        }
    }
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut ins = conn
        .prepare("INSERT INTO site_memory VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")?;
    for ((pid, stack), a) in &acc {
        ins.execute(params![
            pid,
            // Stack ids are 64-bit hashes stored as their bits, as `calls` stores them.
            stack.map(|s| s as i64),
            clamp(a.first.0),
            a.first.1,
            clamp(a.allocs),
            clamp(a.alloc_bytes),
            clamp(a.unfreed),
            clamp(a.unfreed_bytes),
            clamp(a.at_peak_bytes),
            clamp(a.failed),
            clamp(a.failed_bytes)
        ])?;
    }
    // The recorded calls that carry a site, by site and op (through the
    // partial index on stack_id: calls without a site are not read).
    let mut calls: BTreeMap<(u32, u64, &'static str), SiteCalls> = BTreeMap::new();
    let mut st = conn.prepare(&format!(
        "SELECT pid, stack_id, op, ret, count(*), total(dur_ns) FROM calls \
         WHERE stack_id IS NOT NULL AND {} GROUP BY pid, stack_id, op, ret",
        valid_call("")
    ))?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let Some(info) = op_by_name(r.get_ref(2)?.as_str()?) else {
            continue;
        };
        let (pid, stack, ret): (u32, i64, i64) = (r.get(0)?, r.get(1)?, r.get(3)?);
        let (n, total): (i64, f64) = (r.get(4)?, r.get(5)?);
        let failed = CallEvent {
            op: info.id,
            ret,
            ..Default::default()
        }
        .failed();
        let e = calls.entry((pid, stack as u64, info.name)).or_default();
        e.calls += n.max(0) as u64;
        e.errors += if failed { n.max(0) as u64 } else { 0 };
        e.total_ns = e.total_ns.saturating_add(total as u64);
    }
    let mut ins = conn.prepare("INSERT INTO site_calls VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
    for ((pid, stack, op), c) in &calls {
        ins.execute(params![
            pid,
            *stack as i64,
            op,
            clamp(c.calls),
            clamp(c.errors),
            clamp(c.total_ns)
        ])?;
    }
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('site_rollup', ?1)",
        [COMPLETE],
    )?;
    Ok(())
}

/// Whether the trace holds a complete site rollup of the shape gpusleuth
/// writes; a table of another shape is damage (an error).
fn complete(conn: &Connection) -> rusqlite::Result<bool> {
    complete_tables(
        conn,
        "site_rollup",
        &[("site_memory", MEMORY_COLS), ("site_calls", CALLS_COLS)],
    )
}

fn damaged(what: &str) -> rusqlite::Error {
    damaged_table("site rollup", what)
}

/// `sleuth_core::sites::memory_by_site` of the processes in `pids` at the
/// end of the trace, from the stored rows, labelled with `context`'s
/// stacks; None when the trace has no complete rollup.
pub(crate) fn memory_by_site(
    conn: &Connection,
    pids: &BTreeSet<u32>,
    context: &TraceData,
) -> rusqlite::Result<Option<Vec<SiteMemory>>> {
    if !complete(conn)? {
        return Ok(None);
    }
    let mut st = conn.prepare(
        "SELECT pid, stack_id, first_ts_ns, first_id, allocs, alloc_bytes, unfreed, unfreed_bytes, \
         at_peak_bytes, failed, failed_bytes FROM site_memory",
    )?;
    let mut rows = st.query([])?;
    // By label: the sums, and the first allocation whose stack is stored.
    let mut by_label: BTreeMap<String, (SiteMemory, (i64, i64))> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let Ok(pid) = u32::try_from(r.get::<_, i64>(0)?) else {
            continue;
        };
        if !pids.contains(&pid) {
            continue;
        }
        let mut v = [0u64; 7];
        for (i, x) in v.iter_mut().enumerate() {
            let n: i64 = r.get(4 + i)?;
            *x = u64::try_from(n).map_err(|_| damaged("holds a negative count"))?;
        }
        let stack = r.get::<_, Option<i64>>(1)?.map(|s| s as u64);
        let first: (i64, i64) = (r.get(2)?, r.get(3)?);
        let label = label_of(context, stack);
        let (s, best) = by_label.entry(label.clone()).or_insert_with(|| {
            (
                SiteMemory {
                    site: label,
                    ..Default::default()
                },
                (i64::MAX, i64::MAX),
            )
        });
        s.allocs = s.allocs.saturating_add(v[0]);
        s.alloc_bytes = s.alloc_bytes.saturating_add(v[1]);
        s.unfreed = s.unfreed.saturating_add(v[2]);
        s.unfreed_bytes = s.unfreed_bytes.saturating_add(v[3]);
        s.at_peak_bytes = s.at_peak_bytes.saturating_add(v[4]);
        s.failed = s.failed.saturating_add(v[5]);
        s.failed_bytes = s.failed_bytes.saturating_add(v[6]);
        if let Some(id) = stack.filter(|id| context.stacks.contains_key(id)) {
            if s.example_stack.is_none() || first < *best {
                *best = first;
                s.example_stack = Some(id);
            }
        }
    }
    let mut out: Vec<SiteMemory> = by_label.into_values().map(|(s, _)| s).collect();
    out.sort_by(|a, b| {
        (b.unfreed_bytes, b.at_peak_bytes, b.alloc_bytes)
            .cmp(&(a.unfreed_bytes, a.at_peak_bytes, a.alloc_bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
    Ok(Some(out))
}

/// The recorded calls that carry a site, of the processes in `pids`, by
/// (site label, op); None when the trace has no complete rollup.
pub(crate) fn calls_by_site(
    conn: &Connection,
    pids: &BTreeSet<u32>,
    context: &TraceData,
) -> rusqlite::Result<Option<BTreeMap<(String, &'static str), SiteCalls>>> {
    if !complete(conn)? {
        return Ok(None);
    }
    let mut st =
        conn.prepare("SELECT pid, stack_id, op, calls, errors, total_ns FROM site_calls")?;
    let mut rows = st.query([])?;
    let mut out: BTreeMap<(String, &'static str), SiteCalls> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let Ok(pid) = u32::try_from(r.get::<_, i64>(0)?) else {
            continue;
        };
        let Some(info) = op_by_name(r.get_ref(2)?.as_str()?) else {
            continue;
        };
        if !pids.contains(&pid) {
            continue;
        }
        let stack = r.get::<_, i64>(1)? as u64;
        let (n, errors, total): (i64, i64, i64) = (r.get(3)?, r.get(4)?, r.get(5)?);
        if n < 0 || errors < 0 || total < 0 {
            return Err(damaged("holds a negative count"));
        }
        let e = out
            .entry((label_of(context, Some(stack)), info.name))
            .or_default();
        e.calls = e.calls.saturating_add(n as u64);
        e.errors = e.errors.saturating_add(errors as u64);
        e.total_ns = e.total_ns.saturating_add(total as u64);
    }
    Ok(Some(out))
}

/// Device allocations per stack id (None: not captured), the successful
/// ones and the failed ones apart, of process `pid` or every process
/// summed: what the report's flame graph of allocated bytes by call path
/// draws (the successful ones) and a run's per-site table adds up
/// (`crate::run_report`); None when the trace has no complete rollup.
pub(crate) fn allocated_by_stack(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<Option<Vec<sleuth_core::sites::AllocTally>>> {
    if !complete(conn)? {
        return Ok(None);
    }
    let mut st = conn.prepare(
        "SELECT stack_id, allocs, alloc_bytes, failed, failed_bytes FROM site_memory \
         WHERE ?1 IS NULL OR pid = ?1",
    )?;
    let mut rows = st.query([pid])?;
    let mut by_stack: BTreeMap<(Option<u64>, bool), (u64, u64)> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let stack = r.get::<_, Option<i64>>(0)?.map(|s| s as u64);
        for (failed, col) in [(false, 1), (true, 3)] {
            let (n, b): (i64, i64) = (r.get(col)?, r.get(col + 1)?);
            let n = u64::try_from(n).map_err(|_| damaged("holds a negative count"))?;
            let b = u64::try_from(b).map_err(|_| damaged("holds a negative count"))?;
            if failed && n == 0 {
                continue;
            }
            let e = by_stack.entry((stack, failed)).or_default();
            e.0 = e.0.saturating_add(n);
            e.1 = e.1.saturating_add(b);
        }
    }
    Ok(Some(
        by_stack
            .into_iter()
            .map(
                |((stack_id, failed), (count, bytes))| sleuth_core::sites::AllocTally {
                    stack_id,
                    failed,
                    count,
                    bytes,
                },
            )
            .collect(),
    ))
}
