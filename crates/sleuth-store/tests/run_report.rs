//! `report --db DIR` over a run (`sleuth_store::run_report`) against one
//! trace: an example trace cut at a quiet moment into two files of a run
//! reports as the whole trace's report reads (`report_reads::load`): the
//! same per-op rollups, counts, span, slowest calls with their culprits;
//! a run whose allocations and frees cross its files tallies its sites
//! over the files, unfreed from the run's ledger.

mod common;

use common::run_cut::{cut_in_two, Cut};
use common::trace_fixture::rewrite_with_context;
use common::trace_fixture::rewrite_with_options;
use common::TempDir;
use sleuth_core::sites::{SiteMemory, Stack};
use sleuth_core::testing::{alloc, call, failed_alloc, free, py_frame, trace, MS};
use sleuth_core::{CallEvent, TraceData};
use sleuth_store::run::part_name;
use sleuth_store::run_ledger::RunLink;
use sleuth_store::{CheckMemo, ReadBudget, Trace, WriterOptions, DEFAULT_READ_TIMEOUT};

fn budget() -> ReadBudget {
    ReadBudget::new(DEFAULT_READ_TIMEOUT)
}

const SLOWEST: usize = 15;

fn compare(name: &str, tag: &str) {
    let Cut {
        dir: _dir,
        whole,
        run,
        ..
    } = cut_in_two(name, tag);
    let mut pids: Vec<Option<u32>> = vec![None];
    pids.extend(whole.pids().unwrap().into_iter().map(Some));
    for pid in pids {
        let at = format!("{name} pid {pid:?}");
        let one = sleuth_store::report_reads::load(&whole, pid, budget(), SLOWEST)
            .unwrap()
            .expect("a lean report");
        let r = sleuth_store::run_report::load(&run, pid, budget(), &CheckMemo::new(), SLOWEST)
            .unwrap();
        assert_eq!(r.run.files.len(), 2, "{at}");
        assert!(!r.parts.ops.is_empty(), "{at}");
        assert_same_counts(&r.parts, &one.parts, &at);
        // Row ids differ between the files and the whole: the calls by what they are.
        let slow = |s: &[sleuth_store::report_reads::SlowCall]| {
            s.iter()
                .map(|s| (s.call.clone(), s.culprits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            slow(&r.parts.slowest).len(),
            SLOWEST.min(one.parts.slowest.len()),
            "{at}"
        );
        assert_eq!(slow(&r.parts.slowest), slow(&one.parts.slowest), "{at}");
        assert!(
            r.parts.slowest.iter().any(|s| !s.culprits.is_empty()) || name != "h200-contention.db",
            "{at}: the contention trace's slowest calls have culprits"
        );
        assert!(r.allocs.is_none(), "{at}: no call sites in the examples");
        outside_a_window_reads_the_same_run(&run, pid, &r, &at);
    }
}

/// The same per-op rollups, counts and span.
fn assert_same_counts(
    got: &sleuth_store::report_reads::FileParts,
    want: &sleuth_store::report_reads::FileParts,
    at: &str,
) {
    assert_eq!(got.ops, want.ops, "{at}");
    assert_eq!(
        (got.calls, got.waits, &got.calls_by_pid),
        (want.calls, want.waits, &want.calls_by_pid),
        "{at}"
    );
    assert_eq!(
        (got.span.origin_ns, got.span.extent_end_ns),
        (want.span.origin_ns, want.span.extent_end_ns),
        "{at}"
    );
}

/// What a window's report draws from the whole run
/// (`run_report::load_outside_window`) is [`sleuth_store::run_report::load`]'s
/// but the findings' inputs and the slowest calls (the window's own).
fn outside_a_window_reads_the_same_run(
    run: &std::path::Path,
    pid: Option<u32>,
    r: &sleuth_store::run_report::RunReport,
    at: &str,
) {
    let w = sleuth_store::run_report::load_outside_window(run, pid, budget(), &CheckMemo::new())
        .unwrap();
    assert_same_counts(&w.parts, &r.parts, at);
    assert!(w.parts.slowest.is_empty(), "{at}: the window's own");
    assert_eq!(w.run.ledgers, r.run.ledgers, "{at}");
    assert_eq!(w.run.data.processes, r.run.data.processes, "{at}");
    assert_eq!(
        (&w.run.files, &w.session),
        (&r.run.files, &r.session),
        "{at}"
    );
    assert_eq!(w.notes.len(), r.notes.len(), "{at}");
    // No finding aggregate is read (the window's explanation is its own).
    assert!(
        w.run.inputs.ops.is_empty() && w.run.inputs.threads.is_empty(),
        "{at}"
    );
    assert!(!r.run.inputs.ops.is_empty(), "{at}");
}

#[test]
fn a_run_cut_in_two_reports_as_the_whole_trace_h200() {
    compare("h200-contention.db", "run-report-h200");
}

#[test]
fn a_run_cut_in_two_reports_as_the_whole_trace_demo() {
    compare("demo-sim.db", "run-report-demo");
}

const SITE_A: u64 = 0xf000_0000_0000_00a1;
const SITE_B: u64 = 0xf000_0000_0000_00b2;
const SITE_FAIL: u64 = 0xf000_0000_0000_00c3;

fn at(mut c: CallEvent, stack: u64) -> CallEvent {
    c.stack_id = Some(stack);
    c
}

/// A file's trace: `calls`, with the stacks of the sites they name.
fn part(calls: Vec<CallEvent>) -> TraceData {
    let mut data = trace(calls);
    for (id, line) in [(SITE_A, 10), (SITE_B, 20), (SITE_FAIL, 30)] {
        if data.calls.iter().any(|c| c.stack_id == Some(id)) {
            let frames = vec![py_frame("/train.py", line, "step")];
            let (pid, notes) = (100, Vec::new());
            data.stacks.insert(
                id,
                Stack {
                    id,
                    pid,
                    frames,
                    notes,
                },
            );
        }
    }
    data
}

/// The per-site table without the bytes live at the peak (not known over a run).
fn without_peak(sites: Vec<SiteMemory>) -> Vec<SiteMemory> {
    sites
        .into_iter()
        .map(|s| SiteMemory {
            at_peak_bytes: 0,
            ..s
        })
        .collect()
}

/// A made in file 1 and freed in file 3, B made twice (files 1 and 3) and
/// freed once, a failed allocation in file 1: the run's table equals the
/// table of the same calls written as one file (A not unfreed; B's one
/// left unfreed; the failure counted), each file alone does not.
#[test]
fn a_run_tallies_its_sites_over_the_files() {
    let tmp = TempDir::new("run-report-sites");
    let files = [
        vec![
            at(alloc(0, 1 << 20, 0xa000), SITE_A),
            at(alloc(MS, 2 << 20, 0xb000), SITE_B),
            at(failed_alloc(2 * MS, 1 << 40), SITE_FAIL),
            call("cudaLaunchKernel", 10 * MS, 3 * MS),
        ],
        vec![call("cudaLaunchKernel", 100 * MS, 9 * MS)],
        vec![
            free(200 * MS, 0xa000),
            free(205 * MS, 0xb000),
            at(alloc(210 * MS, 2 << 20, 0xb100), SITE_B),
            call("cudaLaunchKernel", 220 * MS, 5 * MS),
        ],
    ];
    let run = tmp.join("run");
    std::fs::create_dir(&run).unwrap();
    let link = RunLink::new_run();
    for (i, calls) in files.iter().enumerate() {
        let n = i as u64 + 1;
        let opts = WriterOptions {
            run: Some(link.for_file(n)),
            ..Default::default()
        };
        rewrite_with_options(&part(calls.clone()), &run.join(part_name(n)), opts);
    }
    let whole = tmp.join("whole.db");
    rewrite_with_context(&part(files.concat()), &whole);
    let one = sleuth_store::report_reads::load(&Trace::open(&whole).unwrap(), None, budget(), 15)
        .unwrap()
        .unwrap();
    let r = sleuth_store::run_report::load(&run, None, budget(), &CheckMemo::new(), 15).unwrap();
    let sites = r.sites();
    assert_eq!(
        without_peak(sites.clone()),
        without_peak(one.sites.unwrap().sites)
    );
    let row = |label: &str| sites.iter().find(|s| s.site.contains(label)).cloned();
    let b = row("/train.py:20").expect("B's row");
    assert_eq!(
        (b.allocs, b.alloc_bytes, b.unfreed, b.unfreed_bytes),
        (2, 4 << 20, 1, 2 << 20)
    );
    let a = row("/train.py:10").expect("A's row");
    assert_eq!((a.allocs, a.unfreed), (1, 0));
    let f = row("/train.py:30").expect("the failure's row");
    assert_eq!((f.failed, f.failed_bytes), (1, 1 << 40));
    // The slowest call of the run is file 2's; the counts add up.
    assert_eq!(r.parts.slowest[0].call.dur_ns, 9 * MS);
    assert_eq!((r.parts.calls, one.parts.calls), (9, 9));
    // A window's report of the run draws the same table.
    let w = sleuth_store::run_report::load_outside_window(&run, None, budget(), &CheckMemo::new())
        .unwrap();
    assert_eq!(w.sites(), sites);
    assert!(w.parts.slowest.is_empty());
    let flame = sleuth_core::sites::allocated_by_path_of(&r.run.data, r.allocs.unwrap());
    assert_eq!(flame.bytes, (1 << 20) + (4 << 20));
}
