//! Issue 14 (reclaim of a daemonized holder) and issue 18 (reclaim's
//! evidence), on the simulated NVML with real processes.
//!
//! A CUDA process forks a worker after CUDA init; the worker leaves the
//! parent's process group and session (`setsid()`, or a double-fork daemon);
//! the parent is SIGKILLed and NVML keeps listing the dead pid with its
//! memory. Nothing links the worker to the dead pid through the process
//! tree: the evidence is that it maps the GPU's device file and has the
//! unified-memory device open (a CUDA context's files) while NVML lists no
//! context of its own. Monitoring agents that only opened `/dev/nvidiactl`
//! (or a GPU device file without mapping it) must never be ended, and
//! nothing is ended when no memory can be shown for it.
//! Ground truth: how each test builds its processes.

#[path = "../../sleuth-gpu/tests/support/mod.rs"]
mod support;
mod vram_common;

use std::process::{Command, Output};
use support::{alive, assert_ended_only, Scene};
use vram_common::{classes, holder, json, json_exit, target_pids};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const DEAD_BYTES: u64 = 2566 * MIB;

fn gpusleuth(scene: &Scene, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    cmd.args(args);
    scene.env(&mut cmd);
    cmd.output().expect("run gpusleuth")
}

/// Parent, process group and session of a live process, from `/proc`.
fn tree_links(pid: u32) -> [u32; 3] {
    let s = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .expect("stat");
    [s.ppid, s.pgrp, s.session].map(|v| u32::try_from(v).expect("a pid"))
}

struct Daemonized {
    scene: Scene,
    dead: u32,
    holder: u32,
    /// Holds only `/dev/nvidiactl` (nvidia-persistenced, a monitoring agent).
    ctl_agent: u32,
    /// Holds `/dev/nvidiactl` mapped and the GPU's device file open, unmapped (like nvidia-smi).
    smi_agent: u32,
}

/// `mode` is `setsid-worker` or `double-fork`.
fn daemonized(name: &str, mode: &str) -> Daemonized {
    let mut scene = Scene::new(name);
    let devs = scene.devices(); // nvidia0, nvidiactl, nvidia-uvm
    let ctl_agent = scene.spawn("hold", &[devs[1].clone()])[0];
    let smi_agent = scene.spawn("hold", &[devs[1].clone(), devs[0].clone()])[0];
    let pw = scene.spawn(mode, &devs);
    let (dead, holder) = (pw[0], pw[1]);
    scene.write_scenario(&format!(
        "driver 580.0-sim\n\
         device Sim-H200 GPU-sim-0 {total} {base}\n\
         compute 0 {dead} {DEAD_BYTES} {dead} {holder}\n",
        total = 140 * GIB,
        base = 500 * MIB,
    ));
    scene.kill_and_reap(dead);
    // The scene really is what the test says: nothing in the process tree
    // (parent, group, session) links the holder to the dead pid.
    let links = tree_links(holder);
    assert!(
        !links.contains(&dead),
        "{mode} holder is still linked: {links:?}"
    );
    assert!(alive(holder) && alive(ctl_agent) && alive(smi_agent));
    Daemonized {
        scene,
        dead,
        holder,
        ctl_agent,
        smi_agent,
    }
}

fn classified_and_reclaimed(mode: &str) {
    let w = daemonized(&format!("daemon-{mode}"), mode);
    let r = json(&gpusleuth(&w.scene, &["vram", "--json"]));
    let c = classes(&r);
    assert_eq!(c[&(w.dead as u64)], "exited_but_listed", "{r}");
    assert_eq!(c[&(w.holder as u64)], "orphaned_worker", "{r}");
    assert_eq!(c[&(w.ctl_agent as u64)], "idle_holder", "{r}");
    assert_eq!(c[&(w.smi_agent as u64)], "idle_holder", "{r}");
    assert_eq!(
        holder(&r, w.dead)["held_by"],
        serde_json::json!([{ "pid": w.holder, "evidence": "inherited_mapping" }]),
        "{r}"
    );
    assert_eq!(
        holder(&r, w.holder)["holds_memory_of"],
        serde_json::json!([w.dead])
    );

    let dry = gpusleuth(&w.scene, &["reclaim", "--orphans", "--json"]);
    let plan = json_exit(&dry, 0);
    assert_eq!(target_pids(&plan), vec![w.holder as u64], "{plan}");
    assert_eq!(plan["plan"]["expected_free_bytes"]["0"], DEAD_BYTES);
    assert!(alive(w.holder), "a dry run signals nobody");

    let run = gpusleuth(
        &w.scene,
        &["reclaim", "--orphans", "--yes", "--grace", "2s", "--json"],
    );
    let res = json_exit(&run, 0);
    assert_eq!(res["outcome"]["memory_released"], true, "{res}");
    assert_eq!(res["outcome"]["verified"], true, "{res}");
    assert_eq!(
        res["outcome"]["freed"][0]["freed_bytes"], DEAD_BYTES,
        "{res}"
    );
    let why = "agents that merely opened device files are never touched";
    assert_ended_only(w.holder, &[(w.ctl_agent, why), (w.smi_agent, why)]);
}

#[test]
fn setsid_worker_is_found_and_reclaimed() {
    classified_and_reclaimed("setsid-worker");
}

#[test]
fn double_fork_daemon_is_found_and_reclaimed() {
    classified_and_reclaimed("double-fork");
}

/// The issue-18 repro: an orphaned process holding only `nvidiactl`, NVML
/// unavailable. It used to be ended, with "Memory released (verified
/// through NVML and /proc)" printed although NVML was never read.
#[test]
fn nvidiactl_alone_is_no_evidence_and_nothing_is_claimed() {
    let mut scene = Scene::new("ctl-only");
    let devs = scene.devices();
    let pw = scene.spawn("fork-worker", &[devs[1].clone()]);
    let (parent, orphan) = (pw[0], pw[1]);
    scene.kill_and_reap(parent);
    for scenario in [
        None,
        Some("driver 580.0-sim\ndevice Sim GPU-sim-0 1000000000 0\n"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
        cmd.args(["reclaim", "--orphans", "--yes", "--grace", "1s"]);
        scene.env(&mut cmd);
        match scenario {
            Some(text) => scene.write_scenario(text),
            None => {
                cmd.env_remove("SIM_NVML_SCENARIO");
            }
        }
        let out = cmd.output().expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(alive(orphan), "{text}");
        assert!(
            !text.contains("verified"),
            "no verification happened: {text}"
        );
        assert!(!text.contains("Memory released"), "{text}");
        assert!(
            text.contains(&format!("pid {orphan}")) && text.contains("no GPU memory"),
            "the refusal names the pid and why: {text}"
        );
        assert_eq!(out.status.code(), Some(3), "{text}");
    }
    // Naming it explicitly does not change the rule.
    let out = gpusleuth(
        &scene,
        &["reclaim", "--pid", &orphan.to_string(), "--yes", "--json"],
    );
    let r = json(&out);
    assert!(target_pids(&r).is_empty(), "{r}");
    assert!(alive(orphan));
}

/// When the only candidate holder of a dead pid's memory has no proven
/// link, `--orphans` leaves it, and says which pid holds what and the exact
/// command that would end it.
#[test]
fn unproven_holder_is_named_with_the_command_that_ends_it() {
    let mut scene = Scene::new("hint");
    let devs = scene.devices();
    // Opens the GPU's device file, maps only nvidiactl: a possible holder, no proof.
    let maybe = scene.spawn("hold", &[devs[1].clone(), devs[0].clone(), devs[2].clone()])[0];
    let gone = scene.spawn("hold", &[])[0];
    scene.kill_and_reap(gone);
    scene.write_scenario(&format!(
        "driver 580.0-sim\ndevice Sim GPU-sim-0 {} 0\ncompute 0 {gone} {}\n",
        80 * GIB,
        GIB
    ));
    let out = gpusleuth(&scene, &["reclaim", "--orphans"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Nothing to reclaim"), "{text}");
    assert!(
        text.contains(&format!("gpusleuth reclaim --pid {maybe}")),
        "{text}"
    );
    assert!(text.contains(&format!("pid {gone}")), "{text}");
    assert!(alive(maybe));
    let r = json(&gpusleuth(&scene, &["reclaim", "--orphans", "--json"]));
    let hints = r["plan"]["hints"].as_array().expect("hints");
    assert_eq!(hints.len(), 1, "{r}");
    assert_eq!(hints[0]["pid"], maybe);
    assert_eq!(
        hints[0]["command"],
        format!("gpusleuth reclaim --pid {maybe}")
    );
}
