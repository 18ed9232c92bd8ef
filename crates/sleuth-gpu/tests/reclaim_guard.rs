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
    let mut scene = Scene::new("guard");
    let pid = scene.spawn("hold", &scene.devices())[0];
    let src = sources(&scene);
    let before = src.observe();
    assert!(!before.report.nvml.available);
    assert_eq!(
        before.report.holder(pid).map(|h| h.class),
        Some(Class::IdleHolder)
    );
    let caller = Caller::current(&src.scan.proc_root);
    let mut plan = make_plan(
        &before.report,
        &before.procs,
        &Selection::Pids(vec![pid]),
        &caller,
    );
    assert_eq!(plan.targets.len(), 1);
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
    let caller = Caller::current(&src.scan.proc_root);
    let plan = make_plan(
        &before.report,
        &before.procs,
        &Selection::Pids(vec![pid]),
        &caller,
    );
    let out = execute(&plan, &src, &before, &quick());
    assert_eq!(out.results[0].status, "terminated", "{:?}", out.results);
    assert!(out.memory_released, "{:?}", out.still_held);
    scene.reap(pid);
    assert!(!alive(pid));
    assert!(alive(bystander), "only the planned holder is ended");
}

#[test]
fn sigterm_ignored_escalates_to_sigkill() {
    let mut scene = Scene::new("escalate");
    let pid = scene.spawn("ignore-term", &scene.devices())[0];
    let src = sources(&scene);
    let before = src.observe();
    let caller = Caller::current(&src.scan.proc_root);
    let plan = make_plan(
        &before.report,
        &before.procs,
        &Selection::Pids(vec![pid]),
        &caller,
    );
    let opts = ExecOptions {
        grace: Duration::from_millis(300),
        ..quick()
    };
    let out = execute(&plan, &src, &before, &opts);
    assert_eq!(out.results[0].status, "killed", "{:?}", out.results);
    assert!(out.memory_released);
}
