//! `gpusleuth vram` and `gpusleuth reclaim` against real child processes in
//! each state and a simulated libnvidia-ml.so.1 driven by a scenario file.
//! Ground truth comes from how each test builds its processes.

#[path = "../../sleuth-gpu/tests/support/mod.rs"]
mod support;
mod vram_common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use support::{alive, assert_ended_only, state, wait_until, Scene};
use vram_common::{classes, holder, json, json_exit, refusals, target_pids};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn gpusleuth(scene: &Scene, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    cmd.args(args);
    scene.env(&mut cmd);
    cmd.output().expect("run gpusleuth")
}

/// Every state at once: an alive holder, a crashed parent whose forked worker
/// keeps its memory (exited but listed + orphaned worker), a second orphan the
/// driver does not list, and a zombie NVML still lists.
struct World {
    scene: Scene,
    active: u32,
    dead: u32,
    worker: u32,
    orphan: u32,
    zombie_parent: u32,
    zombie: u32,
}

fn world(name: &str) -> World {
    let mut scene = Scene::new(name);
    let devs = scene.devices();
    let active = scene.spawn("hold", &devs)[0];
    let pw = scene.spawn("fork-worker", &devs);
    let (dead, worker) = (pw[0], pw[1]);
    let pw2 = scene.spawn("fork-worker", &devs[1..]);
    let (dead2, orphan) = (pw2[0], pw2[1]);
    let zp = scene.spawn("zombie-parent", &[]);
    let (zombie_parent, zombie) = (zp[0], zp[1]);
    wait_until("the zombie to be a zombie", || state(zombie) == Some('Z'));
    scene.write_scenario(&format!(
        "driver 580.0-sim\n\
         device Sim-H200 GPU-sim-0 {total} {base}\n\
         compute 0 {active} {a}\n\
         compute 0 {dead} {d} {dead} {worker}\n\
         compute 0 {zombie} {z}\n",
        total = 140 * GIB,
        base = 500 * MIB,
        a = GIB,
        d = 2 * GIB,
        z = 512 * MIB,
    ));
    // The crash: the CUDA parents die, their workers keep the device files.
    scene.kill_and_reap(dead);
    scene.kill_and_reap(dead2);
    World {
        scene,
        active,
        dead,
        worker,
        orphan,
        zombie_parent,
        zombie,
    }
}

#[test]
fn vram_classifies_every_state_exactly() {
    let w = world("classify");
    let out = gpusleuth(&w.scene, &["vram", "--json"]);
    let r = json_exit(&out, 0);
    assert_eq!(r["nvml"]["available"], true);
    let expected: BTreeMap<u64, String> = [
        (w.active, "active"),
        (w.dead, "exited_but_listed"),
        (w.worker, "orphaned_worker"),
        (w.orphan, "orphaned_worker"),
        (w.zombie, "zombie"),
    ]
    .into_iter()
    .map(|(p, c)| (p as u64, c.to_string()))
    .collect();
    assert_eq!(
        classes(&r),
        expected,
        "zombie parent {} holds nothing",
        w.zombie_parent
    );

    let dead = holder(&r, w.dead);
    assert_eq!(
        dead["held_by"],
        serde_json::json!([{ "pid": w.worker, "evidence": "process_group" }])
    );
    assert_eq!(dead["gpus"][0]["used_bytes"], 2 * GIB);
    assert!(dead["process"].is_null());
    assert_eq!(
        holder(&r, w.worker)["holds_memory_of"],
        serde_json::json!([w.dead])
    );
    let worker_known: Vec<&str> = holder(&r, w.worker)["known_by"]
        .as_array()
        .expect("known_by")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(worker_known, vec!["open_fds", "mappings"]);
    assert_eq!(holder(&r, w.zombie)["reap_parent"], w.zombie_parent);
    assert_eq!(holder(&r, w.active)["process"]["state"], "sleeping");

    let g = &r["gpus"][0];
    assert_eq!(g["used_bytes"], 500 * MIB + GIB + 2 * GIB + 512 * MIB);
    assert_eq!(g["listed_bytes"], GIB + 2 * GIB + 512 * MIB);
    assert_eq!(g["unattributed_bytes"], 500 * MIB);
    assert_eq!(g["held_by_nobody_visible_bytes"], 0);

    // The human view names the real holder of the dead pid's memory.
    let text = String::from_utf8_lossy(&gpusleuth(&w.scene, &["vram"]).stdout).into_owned();
    assert!(
        text.contains(&format!("its memory is kept by pid {}", w.worker)),
        "{text}"
    );
}

#[test]
fn reclaim_orphans_plans_then_kills_exactly_the_orphans() {
    let w = world("reclaim");
    let dry = gpusleuth(&w.scene, &["reclaim", "--orphans", "--json"]);
    let plan = json_exit(&dry, 0);
    assert_eq!(plan["dry_run"], true);
    let targets = target_pids(&plan);
    // The orphan holds only nvidiactl and nvidia-uvm and NVML shows no
    // memory for it: it is refused, never a target (issue 18).
    assert_eq!(targets, vec![w.worker as u64]);
    let refused = refusals(&plan);
    assert_eq!(refused.len(), 1, "{plan}");
    let why = &refused[&(w.orphan as u64)];
    assert!(why.contains("no GPU memory"), "{why}");
    assert_eq!(plan["plan"]["expected_free_bytes"]["0"], 2 * GIB);
    assert!(plan["outcome"].is_null());
    assert!(
        alive(w.worker) && alive(w.orphan),
        "a dry run signals nobody"
    );

    let run = gpusleuth(
        &w.scene,
        &["reclaim", "--orphans", "--yes", "--grace", "2s", "--json"],
    );
    let res = json_exit(&run, 0);
    assert_eq!(res["outcome"]["memory_released"], true);
    assert_eq!(res["outcome"]["freed"][0]["freed_bytes"], 2 * GIB, "{res}");
    assert_ended_only(
        w.worker,
        &[
            (w.orphan, "no memory shown for the orphan: never ended"),
            (w.active, "the active holder was not a target"),
            (w.zombie_parent, "the zombie's parent was not a target"),
        ],
    );

    // Now the active holder, the zombie and the memoryless orphan remain.
    let after = json(&gpusleuth(&w.scene, &["vram", "--json"]));
    let left: Vec<u64> = classes(&after).into_keys().collect();
    let mut want_left = vec![w.active as u64, w.zombie as u64, w.orphan as u64];
    want_left.sort();
    assert_eq!(left, want_left);
}

#[test]
fn zombie_is_refused_and_its_parent_offered() {
    let w = world("zombie");
    let out = gpusleuth(
        &w.scene,
        &["reclaim", "--pid", &w.zombie.to_string(), "--yes", "--json"],
    );
    let r = json_exit(&out, 3);
    let refused = &r["plan"]["refused"][0];
    assert_eq!(refused["pid"], w.zombie);
    assert!(refused["reason"]
        .as_str()
        .expect("reason")
        .contains("zombie"));
    assert!(refused["suggestion"]
        .as_str()
        .expect("suggestion")
        .contains(&format!("--pid {}", w.zombie_parent)));
    assert!(r["outcome"].is_null());
    assert!(alive(w.zombie_parent));
}

#[test]
fn dead_listed_pid_resolves_to_its_worker() {
    let w = world("deadpid");
    let out = gpusleuth(
        &w.scene,
        &[
            "reclaim",
            "--pid",
            &w.dead.to_string(),
            "--yes",
            "--grace",
            "2s",
            "--json",
        ],
    );
    let r = json_exit(&out, 0);
    let targets = target_pids(&r);
    assert_eq!(targets, vec![w.worker as u64]);
    let why = "only the dead pid's own worker is ended";
    assert_ended_only(w.worker, &[(w.orphan, why), (w.active, why)]);
}

#[test]
fn refusals_signal_nobody() {
    let mut scene = Scene::new("refuse");
    scene.write_scenario(&format!("device Sim GPU-sim-0 {} 0\n", 80 * GIB));
    let idle = scene.spawn("hold", &[])[0]; // holds no device file
    let me = std::process::id(); // an ancestor of the gpusleuth we start
    let kthread = (2..200)
        .find(|&p| is_kthread(p))
        .expect("a visible kernel thread (pid 2 kthreadd on these machines)");
    let out = gpusleuth(
        &scene,
        &[
            "reclaim",
            "--pid",
            "1",
            &me.to_string(),
            &kthread.to_string(),
            &idle.to_string(),
            "--yes",
            "--json",
        ],
    );
    let r = json_exit(&out, 3);
    assert!(r["plan"]["targets"].as_array().expect("targets").is_empty());
    let why = refusals(&r);
    assert!(why[&1].contains("pid 1"));
    assert!(why[&(me as u64)].contains("ancestor"));
    assert!(why[&(kthread as u64)].contains("kernel thread"));
    assert!(why[&(idle as u64)].contains("not a GPU holder"));
    assert!(alive(idle));
}

/// PF_KTHREAD in `/proc/PID/stat`'s flags.
fn is_kthread(pid: i32) -> bool {
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.flags & 0x0020_0000 != 0)
}

#[test]
fn other_users_process_is_refused_unless_root() {
    use std::os::unix::process::CommandExt;
    if !support::is_root() {
        assert!(
            !support::on_ci(),
            "CI runs as root: this test must run there"
        );
        vram_common::skipped("needs root to start gpusleuth as another user");
        return;
    }
    let mut scene = Scene::new("otheruser");
    let victim = scene.spawn("hold", &scene.devices())[0]; // owned by root
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    cmd.args(["reclaim", "--pid", &victim.to_string(), "--yes", "--json"])
        .uid(65534)
        .gid(65534);
    cmd.env("GPUSLEUTH_DEV_PREFIX", &scene.dev_prefix)
        .env("GPUSLEUTH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1");
    let out = cmd.output().expect("run as nobody");
    let r = json_exit(&out, 3);
    let reason = r["plan"]["refused"][0]["reason"]
        .as_str()
        .expect("reason")
        .to_string();
    assert!(reason.contains("only root"), "{reason}");
    assert!(alive(victim));
}

#[test]
fn absent_nvml_gives_a_clean_message_and_proc_view() {
    let mut scene = Scene::new("nonvml");
    let pid = scene.spawn("hold", &scene.devices())[0];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    cmd.arg("vram")
        .env("GPUSLEUTH_DEV_PREFIX", &scene.dev_prefix)
        .env("GPUSLEUTH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1");
    let out = cmd.output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("NVML not available: "), "{text}");
    assert!(
        text.lines()
            .next()
            .unwrap_or("")
            .ends_with("; showing /proc holders only"),
        "{text}"
    );
    assert!(
        text.contains(&pid.to_string()) && text.contains("idle_holder"),
        "{text}"
    );

    // The simulated library loads but its driver is "not loaded" (no scenario): same path.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    cmd.args(["vram", "--json"])
        .env("GPUSLEUTH_DEV_PREFIX", &scene.dev_prefix)
        .env("GPUSLEUTH_NVML_LIB", &support::fixtures().sim_nvml)
        .env_remove("SIM_NVML_SCENARIO");
    let r = json(&cmd.output().expect("run"));
    assert_eq!(r["nvml"]["available"], false);
    assert!(
        r["nvml"]["reason"]
            .as_str()
            .expect("reason")
            .to_lowercase()
            .contains("driver"),
        "{r}"
    );
    assert_eq!(holder(&r, pid)["class"], "idle_holder");
}

#[test]
fn watch_into_a_pipe_prints_plain_lines_and_flags_dead_memory() {
    let w = world("watch");
    let out = gpusleuth(
        &w.scene,
        &["vram", "--watch", "--count", "2", "--interval", "100ms"],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains('\x1b'),
        "no escape codes into a pipe: {text:?}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("gpu0 used=")).count(),
        2,
        "{text}"
    );
    let flags: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("FLAG: memory held after its process died"))
        .collect();
    assert_eq!(flags.len(), 1, "flagged once, not every refresh: {text}");
    assert!(
        flags[0].contains(&format!("pid {} is gone", w.dead)),
        "{text}"
    );
}
