//! The checks of a first read, run side by side.
//!
//! The first read of a large file nobody checked pays, one after the other,
//! the `quick_check` of each per-call and per-wait table, the pass over the
//! call rows and the skipped-row counts: 3.8 s on a 10M-call file, most of
//! it one core waiting on SQLite (docs/benchmarks.md, round 11). They are
//! independent but for one rule: no bulk table is read before its
//! `quick_check` passed (docs/schema.md "Reading untrusted files"). A
//! [`Plan`] is those checks as tasks with that rule as dependencies; workers
//! (the caller's thread on the trace's connection, plus up to
//! [`MAX_WORKERS`]` - 1` threads each on a connection of its own, opened as
//! every reader opens the file and under the same budget) take the first
//! task whose dependencies passed. The pass over the call rows is split
//! into rowid ranges so that it, too, spreads over the cores.
//!
//! What a failure gives does not depend on the schedule: tasks are in a
//! fixed order (the order one connection ran them in), a failure stops only
//! the tasks after it, and the error reported is the first failed task's,
//! so the message is the one a run on one connection would give. Nothing is
//! recorded unless every task passed.

use crate::budget::ReadBudget;
use crate::error::StoreError;
use crate::open::check_table;
use crate::problems::{self, CallScan, CallSums, InputProblems, OpRows};
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Condvar, Mutex};

/// Connections at most (the caller's included): the checks are a handful
/// of b-tree passes, and each connection keeps its own page cache.
pub(crate) const MAX_WORKERS: usize = 8;

/// Rowid ranges per worker for the pass over the call rows: more parts
/// than workers, so that a worker that finished its other checks takes a
/// share (one part per worker left the last part alone on one core).
const PARTS_PER_WORKER: usize = 2;

/// One check.
#[derive(Debug, Clone)]
enum Task {
    /// `quick_check` of a bulk table.
    Table(&'static str),
    /// Every call row, counted (the table's smallest b-tree).
    CallRows,
    /// The smallest and largest rowid of the call rows.
    CallIds,
    /// Part `.0` of `.1` of the pass over the call rows.
    CallPart(usize, usize),
    /// One of `problems::op_name_queries`, by position.
    OpNames(usize),
    /// The waits readers skip.
    Waits,
}

/// What a task found.
#[derive(Debug, Clone)]
enum Found {
    Passed,
    Rows(u64),
    Ids(Option<(i64, i64)>),
    Sums(CallSums),
    Names(OpRows),
}

/// How a task failed: a check's own error, or SQLite's (reported as the
/// reader reports a failed read).
#[derive(Debug)]
enum Failed {
    Check(StoreError),
    Sql(rusqlite::Error),
}

#[derive(Debug)]
enum Slot {
    Pending,
    Running,
    Done(Found),
    Failed(Failed),
}

/// What a plan found, once every task passed.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Bulk tables whose `quick_check` passed.
    pub tables: Vec<&'static str>,
    /// The pass over the call rows, when the plan made it.
    pub calls: Option<CallScan>,
    /// The skipped-row counts, when the plan made them.
    pub problems: Option<InputProblems>,
    /// Check pragmas run on other threads (tests count those of a read).
    pub checks_elsewhere: usize,
}

/// The checks one read needs, in the order one connection would run them.
pub(crate) struct Plan {
    tasks: Vec<Task>,
    /// Indexes of the tasks each task needs passed first.
    deps: Vec<Vec<usize>>,
    version: i64,
    /// Positions of the call-row tasks and the op-name queries, when the
    /// plan counts (see [`Plan::counts`]).
    op_queries: Vec<String>,
    known_calls: Option<CallScan>,
}

impl Plan {
    /// The `quick_check` of `tables` (bulk tables not passed yet).
    pub(crate) fn tables(tables: &[&'static str], version: i64) -> Plan {
        let tasks: Vec<Task> = tables.iter().map(|&t| Task::Table(t)).collect();
        Plan {
            deps: vec![Vec::new(); tasks.len()],
            tasks,
            version,
            op_queries: Vec::new(),
            known_calls: None,
        }
    }

    /// The `quick_check` of `tables`, then the skipped-row counts and the
    /// pass over the call rows (unless `known`), for a trace of `version`
    /// with or without `allocator_events`. A read of the call rows needs
    /// the call table's check; the waits count, the waits' check; the
    /// other counted tables were checked at open.
    pub(crate) fn counts(
        tables: &[&'static str],
        version: i64,
        has_allocator_events: bool,
        known: Option<CallScan>,
        workers: usize,
    ) -> Plan {
        let mut plan = Plan::tables(tables, version);
        let table_task = |plan: &Plan, name: &str| -> Vec<usize> {
            plan.tasks
                .iter()
                .position(|t| matches!(t, Task::Table(n) if *n == name))
                .into_iter()
                .collect()
        };
        let calls = table_task(&plan, problems::call_table(version));
        if known.is_none() {
            plan.push(Task::CallRows, calls.clone());
            let ids = plan.push(Task::CallIds, calls.clone());
            let parts = (workers * PARTS_PER_WORKER).max(1);
            for i in 0..parts {
                plan.push(Task::CallPart(i, parts), vec![ids]);
            }
        }
        plan.op_queries = problems::op_name_queries(version, has_allocator_events);
        for i in 0..plan.op_queries.len() {
            // The first query reads the call rows; the others, tables
            // checked at open.
            let deps = if i == 0 { calls.clone() } else { Vec::new() };
            plan.push(Task::OpNames(i), deps);
        }
        let waits = table_task(&plan, "waits");
        plan.push(Task::Waits, waits);
        plan.known_calls = known;
        plan
    }

    fn push(&mut self, task: Task, deps: Vec<usize>) -> usize {
        self.tasks.push(task);
        self.deps.push(deps);
        self.tasks.len() - 1
    }

    /// Runs the plan: on `conn` (the caller's thread) and on up to
    /// `workers - 1` connections from `open` (None: that worker does not
    /// help, e.g. the file is no longer the one `conn` has open). Every
    /// statement runs under `budget` (each connection is watched by it), so
    /// its deadline or cancellation stops every worker.
    pub(crate) fn run<F>(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
        workers: usize,
        open: F,
    ) -> Result<Outcome, StoreError>
    where
        F: Fn() -> Option<Connection> + Sync,
    {
        let board = Board {
            slots: Mutex::new(self.tasks.iter().map(|_| Slot::Pending).collect()),
            changed: Condvar::new(),
        };
        let helpers = workers.clamp(1, MAX_WORKERS).min(self.tasks.len().max(1)) - 1;
        let checks_elsewhere = std::thread::scope(|s| {
            let handles: Vec<_> = (0..helpers)
                .map(|_| {
                    s.spawn(|| {
                        let Some(own) = open() else { return 0 };
                        self.work(&own, path, budget, &board)
                    })
                })
                .collect();
            self.work(conn, path, budget, &board);
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .sum::<usize>()
        });
        let slots = board.slots.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut outcome = self.outcome(slots, path, budget)?;
        outcome.checks_elsewhere = checks_elsewhere;
        Ok(outcome)
    }

    /// One worker: takes the first task whose dependencies passed until
    /// none is left that could run. Returns the check pragmas it ran.
    fn work(&self, conn: &Connection, path: &Path, budget: &ReadBudget, board: &Board) -> usize {
        let mut checks = 0;
        let mut slots = board.lock();
        loop {
            if budget.is_stopped() {
                board.changed.notify_all();
                return checks;
            }
            match self.next(&slots) {
                Next::Run(i) => {
                    let task = self.tasks[i].clone();
                    let range = self.part_range(&task, &slots);
                    slots[i] = Slot::Running;
                    drop(slots);
                    if matches!(task, Task::Table(_)) {
                        checks += 1;
                    }
                    // A task that panicked must still leave its slot, or
                    // the workers waiting on it would wait forever.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.run_task(conn, path, budget, &task, range)
                    }))
                    .unwrap_or_else(|_| {
                        Err(Failed::Check(StoreError::file(
                            path,
                            "integrity check stopped: a check failed unexpectedly",
                        )))
                    });
                    slots = board.lock();
                    slots[i] = match result {
                        Ok(found) => Slot::Done(found),
                        Err(e) => Slot::Failed(e),
                    };
                    board.changed.notify_all();
                }
                Next::Wait => {
                    slots = board.changed.wait(slots).unwrap_or_else(|e| e.into_inner());
                }
                Next::Finished => return checks,
            }
        }
    }

    /// The first pending task before any failed one whose dependencies
    /// passed; Wait while one may still become runnable.
    fn next(&self, slots: &[Slot]) -> Next {
        // Tasks after a failure are not run: the first failure is the error
        // whatever they would find.
        let end = slots
            .iter()
            .position(|s| matches!(s, Slot::Failed(_)))
            .unwrap_or(slots.len());
        let mut waiting = false;
        for i in 0..end {
            if !matches!(slots[i], Slot::Pending) {
                continue;
            }
            let deps = &self.deps[i];
            if deps.iter().any(|&d| matches!(slots[d], Slot::Failed(_))) {
                // Never runs; its dependency's failure comes first.
                continue;
            }
            if deps.iter().all(|&d| matches!(slots[d], Slot::Done(_))) {
                return Next::Run(i);
            }
            waiting = true;
        }
        if waiting || slots[..end].iter().any(|s| matches!(s, Slot::Running)) {
            Next::Wait
        } else {
            Next::Finished
        }
    }

    /// What a call-row part reads, from the [`Task::CallIds`] it depends
    /// on (other tasks: nothing).
    fn part_range(&self, task: &Task, slots: &[Slot]) -> PartRange {
        let Task::CallPart(i, n) = *task else {
            return PartRange::Nothing;
        };
        let ids = slots.iter().find_map(|s| match s {
            Slot::Done(Found::Ids(ids)) => Some(*ids),
            _ => None,
        });
        match ids.flatten() {
            Some((lo, hi)) => {
                problems::rowid_part(lo, hi, i, n).map_or(PartRange::Nothing, PartRange::Ids)
            }
            // A table that cannot be split (or has no rows) is read whole
            // by the first part.
            None if i == 0 => PartRange::Whole,
            None => PartRange::Nothing,
        }
    }

    fn run_task(
        &self,
        conn: &Connection,
        path: &Path,
        budget: &ReadBudget,
        task: &Task,
        range: PartRange,
    ) -> Result<Found, Failed> {
        let v = self.version;
        match task {
            Task::Table(name) => check_table(conn, path, budget, name)
                .map(|()| Found::Passed)
                .map_err(Failed::Check),
            Task::CallRows => problems::call_rows(conn, v)
                .map(Found::Rows)
                .map_err(Failed::Sql),
            Task::CallIds => problems::call_rowids(conn, v)
                .map(Found::Ids)
                .map_err(Failed::Sql),
            Task::CallPart(..) => {
                let ids = match range {
                    PartRange::Nothing => return Ok(Found::Sums(CallSums::default())),
                    PartRange::Whole => None,
                    PartRange::Ids(r) => Some(r),
                };
                problems::call_sums(conn, v, ids)
                    .map(Found::Sums)
                    .map_err(Failed::Sql)
            }
            Task::OpNames(i) => problems::op_rows(conn, &self.op_queries[*i])
                .map(Found::Names)
                .map_err(Failed::Sql),
            Task::Waits => problems::bad_waits(conn)
                .map(Found::Rows)
                .map_err(Failed::Sql),
        }
    }

    /// The plan's result from its finished slots: the first failure (in
    /// task order), or what every task found.
    fn outcome(
        &self,
        slots: Vec<Slot>,
        path: &Path,
        budget: &ReadBudget,
    ) -> Result<Outcome, StoreError> {
        let mut found = Vec::with_capacity(slots.len());
        for slot in slots {
            match slot {
                Slot::Done(f) => found.push(f),
                Slot::Failed(Failed::Check(e)) => return Err(e),
                Slot::Failed(Failed::Sql(e)) => return Err(read_error(path, budget, e)),
                // Not run: the budget stopped the workers (or a helper
                // died); the file's checks did not finish.
                Slot::Pending | Slot::Running => {
                    let why = budget
                        .stop_reason()
                        .unwrap_or_else(|| "a check did not finish".into());
                    return Err(StoreError::file(
                        path,
                        format!("integrity check stopped: {why}"),
                    ));
                }
            }
        }
        let mut out = Outcome::default();
        let (mut rows, mut sums, mut names, mut waits) = (None, CallSums::default(), vec![], 0);
        for (task, f) in self.tasks.iter().zip(found) {
            match (task, f) {
                (Task::Table(t), _) => out.tables.push(t),
                (Task::CallRows, Found::Rows(n)) => rows = Some(n),
                (Task::CallPart(..), Found::Sums(s)) => sums.add(s),
                (Task::OpNames(_), Found::Names(n)) => names.push(n),
                (Task::Waits, Found::Rows(n)) => waits = n,
                _ => {}
            }
        }
        if self.op_queries.is_empty() {
            return Ok(out);
        }
        let calls = match (self.known_calls, rows) {
            (Some(c), _) => c,
            (None, Some(rows)) => sums.scan(rows),
            (None, None) => unreachable_plan(path)?,
        };
        out.calls = Some(calls);
        out.problems = Some(problems::problems_of(&names, calls, waits));
        Ok(out)
    }
}

/// A plan that counts always has either the known pass or its tasks.
fn unreachable_plan(path: &Path) -> Result<CallScan, StoreError> {
    Err(StoreError::file(path, "the call-row pass did not run"))
}

/// The call rows one part of the pass reads.
#[derive(Debug, Clone, Copy)]
enum PartRange {
    Whole,
    Ids((i64, i64)),
    Nothing,
}

enum Next {
    Run(usize),
    Wait,
    Finished,
}

struct Board {
    slots: Mutex<Vec<Slot>>,
    changed: Condvar,
}

impl Board {
    /// The slots; a worker that panicked left each one whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A failed read, naming the budget when it stopped the read (as
/// `Trace::read_error`).
fn read_error(path: &Path, budget: &ReadBudget, e: rusqlite::Error) -> StoreError {
    match budget.stop_reason() {
        Some(why) => StoreError::file(path, format!("reading stopped: {why}")),
        None => StoreError::Sqlite {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// Workers for a plan: the machine's cores, at most [`MAX_WORKERS`].
pub(crate) fn workers() -> usize {
    #[cfg(test)]
    if let Some(n) = test_seams::WORKERS.with(|w| w.get()) {
        return n;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_WORKERS)
}

#[cfg(test)]
pub(crate) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Workers of the plans run from this thread, when set.
        pub(crate) static WORKERS: Cell<Option<usize>> = const { Cell::new(None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::CheckMemo;
    use crate::open::test_seams::FULL_CHECK_BYTES;
    use crate::Trace;
    use std::time::{Duration, Instant};

    fn budget() -> ReadBudget {
        ReadBudget::new(Duration::from_secs(30))
    }

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gs-plan-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    /// Runs `test` with plans of 1 to 4 workers, on the large-file path
    /// (bulk tables checked on first read), on this thread.
    fn each_workers(mut test: impl FnMut(usize)) {
        FULL_CHECK_BYTES.with(|b| b.set(Some(0)));
        for w in 1..=4 {
            test_seams::WORKERS.with(|c| c.set(Some(w)));
            test(w);
        }
        test_seams::WORKERS.with(|c| c.set(None));
        FULL_CHECK_BYTES.with(|b| b.set(None));
    }

    /// Which bulk table a task reads rows of, stated apart from the plan's
    /// dependencies: the rule they must keep.
    fn reads(task: &Task, version: i64) -> Option<&'static str> {
        match task {
            Task::CallRows | Task::CallIds | Task::CallPart(..) | Task::OpNames(0) => {
                Some(problems::call_table(version))
            }
            Task::Waits => Some("waits"),
            Task::Table(_) | Task::OpNames(_) => None,
        }
    }

    /// Whatever order the workers finish tasks in, no task that reads a
    /// bulk table is handed out before that table's `quick_check` passed,
    /// and a failed check keeps every reader of its table from running.
    #[test]
    fn no_bulk_table_is_read_before_its_check_passed() {
        let tables = ["call_rows", "call_culprits", "waits", "wait_culprits"];
        for seed in 0..200u64 {
            let plan = Plan::counts(&tables, 2, true, None, 3);
            let mut slots: Vec<Slot> = plan.tasks.iter().map(|_| Slot::Pending).collect();
            let mut running: Vec<usize> = Vec::new();
            let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut roll = |n: usize| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((rng >> 33) as usize) % n
            };
            // One table fails in some runs.
            let failing = (seed % 3 == 0).then(|| tables[seed as usize % tables.len()]);
            loop {
                // Up to 3 tasks at once, like 3 workers.
                while running.len() < 3 {
                    let Next::Run(i) = plan.next(&slots) else {
                        break;
                    };
                    if let Some(t) = reads(&plan.tasks[i], 2) {
                        let check = plan
                            .tasks
                            .iter()
                            .position(|x| matches!(x, Task::Table(n) if *n == t))
                            .expect("a check of the table");
                        assert!(
                            matches!(slots[check], Slot::Done(_)),
                            "seed {seed}: {:?} handed out before {t}'s check passed",
                            plan.tasks[i]
                        );
                    }
                    slots[i] = Slot::Running;
                    running.push(i);
                }
                if running.is_empty() {
                    break;
                }
                let i = running.swap_remove(roll(running.len()));
                slots[i] = match (&plan.tasks[i], failing) {
                    (Task::Table(t), Some(f)) if *t == f => {
                        Slot::Failed(Failed::Check(StoreError::Query("damaged".into())))
                    }
                    _ => Slot::Done(Found::Passed),
                };
            }
            assert!(matches!(plan.next(&slots), Next::Finished), "seed {seed}");
        }
    }

    /// A read whose checks all passed has an empty plan: it runs nothing,
    /// whatever the workers (an empty plan once asked for -1 helpers).
    #[test]
    fn an_empty_plan_runs_nothing() {
        let conn = Connection::open_in_memory().expect("db");
        for w in [1, 2, MAX_WORKERS + 3] {
            let out = Plan::tables(&[], 2)
                .run(&conn, Path::new("x.db"), &budget(), w, || {
                    panic!("no helper is needed")
                })
                .expect("nothing to check");
            assert!(out.tables.is_empty() && out.checks_elsewhere == 0);
        }
    }

    /// The example trace as written by today's writer (schema version 2,
    /// `call_rows`), or as it is (version 1, `calls`), at `dir/t.db`.
    fn example_copy(dir: &Path, v2: bool) -> std::path::PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db");
        let path = dir.join("t.db");
        if !v2 {
            std::fs::copy(&src, &path).expect("copy");
            return path;
        }
        let data = Trace::open(&src).expect("open").load(None).expect("load");
        let session = crate::SessionInfo::for_tests();
        let w = crate::TraceWriter::create(&path, session, Default::default()).expect("writer");
        let h = w.handle();
        for p in &data.processes {
            h.set_process(p.clone()).expect("process");
        }
        h.set_op_counts(data.counts.clone()).expect("counts");
        let mut events: Vec<(u64, sleuth_core::Event)> = data
            .calls
            .iter()
            .map(|c| (c.ts_ns, sleuth_core::Event::Call(c.clone())))
            .chain(
                data.waits
                    .iter()
                    .map(|w| (w.on_ns, sleuth_core::Event::Wait(w.clone()))),
            )
            .collect();
        events.sort_by_key(|e| e.0);
        for (_, e) in events {
            h.send(e).expect("event");
        }
        drop(h);
        w.finish().expect("finish");
        path
    }

    /// A damaged bulk table is refused with the same one line whatever the
    /// number of workers, before any read of it (`Rows` streams nothing),
    /// and nothing the failed plan ran is remembered: the next read checks
    /// again and is refused again. Both schema versions.
    #[test]
    fn a_damaged_table_is_refused_in_one_line_and_not_remembered() {
        for (v2, table) in [
            (true, "call_rows"),
            (true, "waits"),
            (true, "call_culprits"),
            (false, "calls"),
            (false, "wait_culprits"),
        ] {
            let mut messages = Vec::new();
            each_workers(|w| {
                let d = dir(&format!("dmg-{table}-{w}"));
                let path = example_copy(&d, v2);
                std::fs::write(&path, crate::open::damaged_root(&path, table)).expect("damage");
                let memo = CheckMemo::settling(Duration::ZERO);
                let trace = Trace::open_remembered(&path, budget(), &memo).expect("open");
                let e = trace.input_problems().expect_err("refused").to_string();
                assert!(e.contains("damaged") && !e.contains('\n'), "{w}: {e}");
                messages.push(e.replace(&d.display().to_string(), "DIR"));
                let id = crate::checked::FileIdentity::of(&path);
                let kept = memo.checks_for(id, id);
                let p = kept.lock();
                assert!(
                    p.bulk.is_empty() && !p.bulk_done && p.call_scan.is_none(),
                    "{w}: nothing remembered: {p:?}"
                );
                drop(p);
                let rows = crate::stream::Rows::open(&trace).expect("the cheap checks pass");
                let mut n = 0;
                let e = rows
                    .for_each_call::<StoreError>(&Default::default(), |_| {
                        n += 1;
                        Ok(())
                    })
                    .expect_err("refused again")
                    .to_string();
                assert!(e.contains("damaged") && n == 0, "{w}: {e} after {n} rows");
                let _ = std::fs::remove_dir_all(&d);
            });
            assert!(
                messages.windows(2).all(|m| m[0] == m[1]),
                "{table}: one message whatever the workers: {messages:?}"
            );
        }
    }

    /// Every worker count reads the same skipped-row counts as one
    /// connection on a trace of today's schema, and a remembered read
    /// after it checks nothing.
    #[test]
    fn a_trace_of_todays_schema_counts_the_same_side_by_side() {
        let d = dir("v2");
        let path = example_copy(&d, true);
        let mut seen = Vec::new();
        each_workers(|w| {
            let memo = CheckMemo::settling(Duration::ZERO);
            let p = Trace::open_remembered(&path, budget(), &memo)
                .and_then(|t| t.input_problems())
                .expect("intact");
            let n = crate::open::test_seams::checks_run();
            Trace::open_remembered(&path, budget(), &memo)
                .and_then(|t| t.input_problems())
                .expect("intact");
            assert_eq!(crate::open::test_seams::checks_run(), n, "{w}");
            seen.push(p);
        });
        assert!(seen.windows(2).all(|s| s[0] == s[1]), "{seen:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The counts and the pass over the call rows are the same from every
    /// number of workers as from one connection, rows with impossible
    /// values, unknown ops and rowids far apart included.
    #[test]
    fn side_by_side_counts_equal_one_connection() {
        let d = dir("counts");
        let path = d.join("v1.db");
        {
            let c = Connection::open(&path).expect("create");
            c.execute_batch(
                "CREATE TABLE calls(id INTEGER PRIMARY KEY, op TEXT, ts_ns INTEGER, dur_ns INTEGER,
                     runnable_ns INTEGER, blocked_ns INTEGER, size INTEGER,
                 pid INTEGER DEFAULT 1, tid INTEGER DEFAULT 1, cpu INTEGER DEFAULT 0);
                 CREATE TABLE op_counts(pid INTEGER, op TEXT, count INTEGER);
                 CREATE TABLE waits(id INTEGER PRIMARY KEY, kind TEXT, off_ns INTEGER,
                     wake_ns INTEGER, on_ns INTEGER,
                 pid INTEGER DEFAULT 1, tid INTEGER DEFAULT 1, cpu INTEGER DEFAULT 0);
                 WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 5000)
                 INSERT INTO calls(op, ts_ns, dur_ns, runnable_ns, blocked_ns, size)
                     SELECT CASE WHEN i % 97 = 0 THEN 'mystery' ELSE 'cudaMalloc' END,
                            i, CASE WHEN i % 89 = 0 THEN -1 ELSE i END, 0, 0,
                            CASE WHEN i % 83 = 0 THEN 'x' ELSE 4096 END FROM r;
                 INSERT INTO calls(id, op, ts_ns, dur_ns, runnable_ns, blocked_ns, size)
                     VALUES (-9223372036854775808, 'cudaFree', 1, 1, 0, 0, NULL),
                            (9223372036854775807, 'cudaFree', 1, NULL, 0, 0, NULL);
                 INSERT INTO op_counts VALUES (1, 'cudaLaunchKernel', 3), (1, 'weird', 2);
                 INSERT INTO waits(kind, off_ns, wake_ns, on_ns)
                     VALUES ('blocked', 1, 2, 3), ('napping', 1, 2, 3), ('preempted', -1, 2, 3);",
            )
            .expect("fill");
        }
        let conn = crate::open::open_untrusted_unchecked(&path).expect("open");
        let (want, want_calls) = problems::scan(&conn, 1, false, None).expect("one connection");
        assert!(want.impossible_calls > 100 && want.impossible_waits == 2);
        for w in 1..=5 {
            let plan = Plan::counts(&[], 1, false, None, w);
            let out = plan
                .run(&conn, &path, &budget(), w, || {
                    crate::open::open_untrusted_unchecked(&path).ok()
                })
                .expect("counted");
            assert_eq!(out.calls, Some(want_calls), "{w} workers");
            assert_eq!(out.problems.as_ref(), Some(&want), "{w} workers");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The budget stops every worker: a deadline that passes while the
    /// checks run ends them all, well before the checks would have ended,
    /// with the budget's reason in one line.
    #[test]
    fn the_budget_stops_every_worker() {
        let d = dir("budget");
        let path = example_copy(&d, true);
        {
            // Enough rows that the checks take a while, most of them waits:
            // a helper (not the caller's thread, which takes `call_rows`
            // first) is then inside the longest check when time is up.
            let c = Connection::open(&path).expect("open");
            c.execute_batch(
                "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 150000)
                 INSERT INTO call_rows(ts_ns, dur_ns, pid_gap, tid, op_id, ret, nested,
                     runnable_ns, blocked_ns, cpu)
                 SELECT i, i, i % 7, 1 + i % 7, (SELECT min(id) FROM ops), 0, 0, 0, 0, 0 FROM r;
                 WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 600000)
                 INSERT INTO waits(pid_gap, tid, kind_id, off_ns, blocked_for, runnable_for,
                     prev_state, cpu)
                 SELECT i % 7, 1 + i % 7, 1, i, 0, 0, 0, 0 FROM r;",
            )
            .expect("fill");
        }
        each_workers(|w| {
            let t = Instant::now();
            Trace::open_with(&path, budget())
                .and_then(|t| t.input_problems())
                .expect("intact");
            let full = t.elapsed();
            let t = Instant::now();
            let short = ReadBudget::new(full / 8);
            let e = Trace::open_with(&path, short)
                .and_then(|t| t.input_problems())
                .expect_err("stopped")
                .to_string();
            let took = t.elapsed();
            assert!(
                (e.contains("stopped") || e.contains("time limit")) && !e.contains('\n'),
                "{w}: {e}"
            );
            assert!(took < full / 2, "{w}: stopped after {took:?} of {full:?}");
        });
        let _ = std::fs::remove_dir_all(&d);
    }
}
