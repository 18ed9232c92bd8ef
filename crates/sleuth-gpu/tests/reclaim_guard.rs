//! Execution against real processes: the pid-reuse guard sends no signal,
//! a planned holder is ended, SIGTERM escalates to SIGKILL. NVML is absent
//! here on purpose (the `/proc` view alone must be enough to act safely).

mod support;

use sleuth_gpu::plan::{make_plan, Caller, Selection};
use sleuth_gpu::proc_scan::ScanConfig;
use sleuth_gpu::reclaim::{execute, ExecOptions};
use sleuth_gpu::{Class, Sources};
use std::time::Duration;
use support::{alive, Scene};

fn sources(scene: &Scene) -> Sources {
    Sources {
        scan: ScanConfig {
            dev_prefix: scene.dev_prefix.clone(),
            ..ScanConfig::default()
        },
        nvml_lib: Some(scene.dir.join("no-such-libnvidia-ml.so.1").into_os_string()),
        seam_note: None,
    }
}

/// A plan that targets `pid` as the planner would if NVML listed it. The
/// planner itself refuses, without NVML, to end anything (issue 18); these
/// tests exercise execution: the identity guard and the signals.
/// A fresh scene with one `holder MODE` of every device file, observed (the
/// scene stays alive as long as the caller keeps it).
fn observed_holder(tag: &str, mode: &str) -> (Scene, u32, Sources, sleuth_gpu::Observation) {
    let mut scene = Scene::new(tag);
    let pid = scene.spawn(mode, &scene.devices())[0];
    let src = sources(&scene);
    let before = src.observe();
    (scene, pid, src, before)
}

fn plan_for(before: &sleuth_gpu::Observation, pid: u32) -> sleuth_gpu::Plan {
    let caller = Caller::current(&std::path::PathBuf::from("/proc"));
    let refused = make_plan(
        &before.report,
        &before.procs,
        &Selection::Pids(vec![pid]),
        &caller,
    );
    assert!(
        refused.targets.is_empty(),
        "no NVML: the planner ends nothing"
    );
    assert!(
        refused.refused[0].reason.contains("NVML is not available"),
        "{:?}",
        refused.refused
    );
    let p = before.procs.get(pid).expect("holder in /proc");
    sleuth_gpu::Plan {
        targets: vec![sleuth_gpu::plan::Target {
            pid,
            start_ticks: p.start_ticks,
            uid: p.uid,
            comm: p.comm.clone(),
            cmdline: p.cmdline.clone(),
            class: Class::IdleHolder,
            reason: "test".into(),
            frees_listed_pids: vec![],
        }],
        refused: vec![],
        hints: vec![],
        expected_free_bytes: Default::default(),
    }
}

fn quick() -> ExecOptions {
    ExecOptions {
        grace: Duration::from_secs(2),
        kill_wait: Duration::from_secs(5),
        verify_timeout: Duration::from_secs(5),
    }
}

#[test]
fn recycled_pid_is_never_signalled() {
    let (_scene, pid, src, before) = observed_holder("guard", "hold");
    assert!(!before.report.nvml.available);
    assert_eq!(
        before.report.holder(pid).map(|h| h.class),
        Some(Class::IdleHolder)
    );
    let mut plan = plan_for(&before, pid);
    // Same pid, different process: what a recycled pid looks like to the plan.
    plan.targets[0].start_ticks += 1;
    let out = execute(&plan, &src, &before, &quick());
    assert_eq!(out.results[0].status, "skipped");
    assert!(
        out.results[0]
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("reused"),
        "{:?}",
        out.results
    );
    assert!(!out.memory_released);
    assert!(alive(pid), "the process must not have been signalled");
}

#[test]
fn planned_holder_is_ended_and_release_verified() {
    let mut scene = Scene::new("end");
    let pid = scene.spawn("hold", &scene.devices())[0];
    let bystander = scene.spawn("hold", &scene.devices())[0];
    let src = sources(&scene);
    let before = src.observe();
    let plan = plan_for(&before, pid);
    let out = execute(&plan, &src, &before, &quick());
    assert_eq!(out.results[0].status, "terminated", "{:?}", out.results);
    // Ended, but NVML could not be read: no verification is claimed.
    assert!(!out.verified && !out.memory_released, "{:?}", out);
    assert!(
        out.still_held.iter().any(|l| l.contains("not verified")),
        "{:?}",
        out.still_held
    );
    scene.reap(pid);
    assert!(!alive(pid));
    assert!(alive(bystander), "only the planned holder is ended");
}

#[test]
fn sigterm_ignored_escalates_to_sigkill() {
    let (_scene, pid, src, before) = observed_holder("escalate", "ignore-term");
    let plan = plan_for(&before, pid);
    let opts = ExecOptions {
        grace: Duration::from_millis(300),
        ..quick()
    };
    let out = execute(&plan, &src, &before, &opts);
    assert_eq!(out.results[0].status, "killed", "{:?}", out.results);
    assert!(!out.verified, "NVML was not read: nothing verified");
}
