//! `gpusleuth vram` and `gpusleuth reclaim` run inside a child pid namespace,
//! the way they run in a container (SECURITY.md, "PID namespaces"): NVML
//! reports host pids, and inside the namespace the same number can name an
//! unrelated local process. The simulated NVML lists
//! - the in-namespace pid of a plain `sleep` (holds no GPU file) as if it were
//!   a GPU process's host pid: the number collides with a local bystander;
//! - the host pid of a real holder started outside: that pid does not exist inside.
//!
//! Both must be shown as `other_namespace` and refused (exit 3, nothing
//! signalled), while a device-file holder started inside the namespace (a
//! local pid, proven by its open files) can still be reclaimed.
//!
//! Needs root, `unshare` and `nsenter` (util-linux). Skips with a reason when
//! they are missing or not permitted, except on CI (`CI=true`), where it fails.

#[path = "../../sleuth-gpu/tests/support/mod.rs"]
mod support;
mod vram_common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use support::{alive, Scene};
use vram_common::{classes, holder, json, json_exit, target_pids};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Why the namespace cannot be built here, or `None` when it can.
fn namespace_unavailable() -> Option<String> {
    if !support::is_root() {
        return Some("needs root to create a pid namespace and enter it".into());
    }
    for (tool, args) in [
        (
            "unshare",
            &["--pid", "--fork", "--mount-proc", "--kill-child", "true"][..],
        ),
        ("nsenter", &["--version"][..]),
    ] {
        match Command::new(tool).args(args).output() {
            Err(e) => {
                return Some(format!(
                    "{tool} is not usable ({e}); it comes with util-linux"
                ))
            }
            Ok(o) if !o.status.success() => {
                return Some(format!(
                    "{tool} {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Ok(_) => {}
        }
    }
    None
}

/// `/proc/PID/status` field `key`, split into numbers (`NSpid`, `PPid`, ...).
fn status_numbers(pid: u32, key: &str) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(&format!("{key}:")))?;
    Some(
        line[key.len() + 1..]
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect(),
    )
}

fn ns_link(path: String) -> Option<std::path::PathBuf> {
    std::fs::read_link(path).ok()
}

/// A child pid namespace holding a `sleep` bystander and a device-file holder.
/// Dropping it kills the namespace's init, which makes the kernel kill every
/// process inside; `unshare --kill-child` covers the case where unshare dies first.
struct Namespace {
    unshare: Child,
    /// Host pid of the namespace's init (pid 1 inside): the `nsenter` target.
    init_host_pid: u32,
    ns: std::path::PathBuf,
    /// In-namespace pid of `sleep` (no GPU files).
    sleep_pid: u32,
    /// In-namespace pid of the holder (holds the scene's device files).
    holder_pid: u32,
}

impl Namespace {
    fn start(scene: &Scene) -> Namespace {
        // Inside: init is `sh`, which starts the bystander, then the holder, then waits.
        // `sleep` is bounded (300 s, like the holder's alarm) in case cleanup never runs.
        let mut unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .args([
                "sh",
                "-c",
                r#"sleep 300 & echo "sleep $!"; "$0" hold "$@" & wait"#,
            ])
            .arg(&support::fixtures().holder)
            .args(scene.devices())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn unshare");
        let stdout = unshare.stdout.take().expect("stdout");
        // Owned by the guard from here on, so a failed start still cleans up.
        let mut me = Namespace {
            unshare,
            init_host_pid: 0,
            ns: std::path::PathBuf::new(),
            sleep_pid: 0,
            holder_pid: 0,
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut pids = BTreeMap::new();
        while pids.len() < 2 {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the namespace to report its sleep and holder pids");
            if let Some((word, pid)) = line.split_once(' ') {
                pids.insert(word.to_string(), pid.trim().parse::<u32>().expect("pid"));
            }
        }
        (me.sleep_pid, me.holder_pid) = (pids["sleep"], pids["ready"]);
        // Read only now: before unshare(2) ran, this link still named the host's namespace.
        me.ns = ns_link(format!("/proc/{}/ns/pid_for_children", me.unshare.id()))
            .expect("unshare's pid_for_children");
        me.init_host_pid = me
            .host_pid(1)
            .expect("the namespace's init seen from the host");
        me
    }

    /// Host pid of the process that has `ns_pid` inside this namespace.
    fn host_pid(&self, ns_pid: u32) -> Option<u32> {
        self.members()
            .into_iter()
            .find(|&(_, n)| n == ns_pid)
            .map(|(h, _)| h)
    }

    /// (host pid, in-namespace pid) of every process in this namespace.
    fn members(&self) -> Vec<(u32, u32)> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&p| ns_link(format!("/proc/{p}/ns/pid")).as_ref() == Some(&self.ns))
            .filter_map(|p| Some((p, *status_numbers(p, "NSpid")?.last()?)))
            .collect()
    }

    /// Runs gpusleuth inside the namespace (its pid and mount namespaces, so
    /// `/proc` there is the namespace's own).
    fn gpusleuth(&self, scene: &Scene, args: &[&str]) -> Output {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.init_host_pid))
            .args(["--pid", "--mount", "--"])
            .arg(env!("CARGO_BIN_EXE_gpusleuth"))
            .args(args);
        scene.env(&mut cmd);
        cmd.output().expect("run gpusleuth through nsenter")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Only signal the init if that host pid is still in our namespace (not reused).
        if self.init_host_pid != 0
            && ns_link(format!("/proc/{}/ns/pid", self.init_host_pid)).as_ref() == Some(&self.ns)
        {
            // SAFETY: plain kill(2) on the pid we just checked is our namespace's init.
            unsafe { libc::kill(self.init_host_pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// `reclaim --yes` on an NVML pid that cannot be translated: exit 3, refused as
/// another namespace's pid, nothing executed.
fn assert_refused_other_namespace(out: &Output, pid: u32) {
    let r = json_exit(out, 3);
    assert!(target_pids(&r).is_empty(), "{r}");
    assert!(r["outcome"].is_null(), "nothing executed: {r}");
    let refused = r["plan"]["refused"].as_array().expect("refused");
    assert_eq!(refused.len(), 1, "{r}");
    assert_eq!(refused[0]["pid"], pid);
    assert!(
        refused[0]["reason"]
            .as_str()
            .expect("reason")
            .contains("another pid namespace"),
        "{r}"
    );
}

#[test]
fn nvml_host_pids_in_a_child_pid_namespace_are_never_signalled() {
    if let Some(why) = namespace_unavailable() {
        assert!(!support::on_ci(), "CI must run the namespace test: {why}");
        vram_common::skipped(&why);
        return;
    }
    let mut scene = Scene::new("pidns");
    // The real GPU process lives outside the namespace; NVML names it by its host pid.
    let host_gpu = scene.spawn("hold", &scene.devices())[0];
    let ns = Namespace::start(&scene);
    let (bystander, local_holder) = (ns.sleep_pid, ns.holder_pid);
    let bystander_host = ns.host_pid(bystander).expect("sleep's host pid");
    let holder_host = ns.host_pid(local_holder).expect("holder's host pid");
    let inside: Vec<u32> = ns.members().into_iter().map(|(_, n)| n).collect();
    assert!(
        !inside.contains(&host_gpu),
        "host pid {host_gpu} must not exist inside the namespace (pids there: {inside:?})"
    );
    assert_ne!(bystander, local_holder);
    scene.write_scenario(&format!(
        "driver 580.0-sim\n\
         device Sim-H200 GPU-sim-0 {total} {base}\n\
         compute 0 {bystander} {a}\n\
         compute 0 {host_gpu} {b}\n",
        total = 140 * GIB,
        base = 500 * MIB,
        a = GIB,
        b = 2 * GIB,
    ));

    // vram: both NVML pids are other_namespace, with no local process attached.
    let out = ns.gpusleuth(&scene, &["vram", "--json"]);
    let r = json_exit(&out, 0);
    assert_eq!(r["nvml"]["available"], true, "{r}");
    assert_eq!(r["pid_namespace"]["initial"], false, "{r}");
    assert_eq!(r["pid_namespace"]["translatable"], false, "{r}");
    let note = r["pid_namespace"]["note"].as_str().expect("namespace note");
    assert!(note.contains("child pid namespace"), "{note}");
    assert!(r["notes"]
        .as_array()
        .expect("notes")
        .contains(&Value::from(note)));
    let expected: BTreeMap<u64, String> = [
        (bystander, "other_namespace"),
        (host_gpu, "other_namespace"),
        (local_holder, "idle_holder"),
    ]
    .into_iter()
    .map(|(p, c)| (p as u64, c.to_string()))
    .collect();
    assert_eq!(classes(&r), expected, "{r}");
    for (pid, bytes) in [(bystander, GIB), (host_gpu, 2 * GIB)] {
        let h = holder(&r, pid);
        assert!(
            h["process"].is_null(),
            "never matched to a local process: {h}"
        );
        assert_eq!(h["known_by"], serde_json::json!(["nvml"]));
        assert_eq!(h["gpus"][0]["used_bytes"], bytes);
        assert_eq!(
            h["held_by"],
            serde_json::json!([]),
            "no local process blamed: {h}"
        );
    }
    // The host pid that does not exist here is not "exited"; its memory is not
    // pinned on the local holder.
    let local = holder(&r, local_holder);
    assert_eq!(local["process"]["pid"], local_holder);
    assert_eq!(local["holds_memory_of"], serde_json::json!([]));
    assert_eq!(r["gpus"][0]["held_by_nobody_visible_bytes"], 0);

    // reclaim of the colliding pid: refused, the bystander is not signalled.
    let out = ns.gpusleuth(
        &scene,
        &[
            "reclaim",
            "--pid",
            &bystander.to_string(),
            "--yes",
            "--json",
        ],
    );
    assert_refused_other_namespace(&out, bystander);
    // reclaim of the host pid: refused as well (it names nobody here).
    let out = ns.gpusleuth(
        &scene,
        &["reclaim", "--pid", &host_gpu.to_string(), "--yes", "--json"],
    );
    assert_refused_other_namespace(&out, host_gpu);
    // --orphans does not turn the untranslatable pids into targets either.
    let out = ns.gpusleuth(&scene, &["reclaim", "--orphans", "--yes", "--json"]);
    let r = json_exit(&out, 0);
    assert!(target_pids(&r).is_empty(), "{r}");
    assert!(r["outcome"].is_null(), "{r}");
    assert!(alive(bystander_host), "the bystander was not signalled");
    assert!(
        alive(holder_host) && alive(host_gpu),
        "nobody was signalled"
    );

    // A local device-file holder is not ended either: NVML's listing cannot
    // be matched here, so no GPU memory can be shown for it (issue 18).
    let out = ns.gpusleuth(
        &scene,
        &[
            "reclaim",
            "--pid",
            &local_holder.to_string(),
            "--yes",
            "--grace",
            "2s",
            "--json",
        ],
    );
    let r = json_exit(&out, 3);
    assert!(target_pids(&r).is_empty(), "{r}");
    let why = r["plan"]["refused"][0]["reason"].as_str().expect("reason");
    assert!(why.contains("no GPU memory can be shown"), "{why}");

    // Nobody was signalled.
    assert!(alive(holder_host), "the local holder is untouched");
    assert!(
        alive(bystander_host),
        "the non-GPU bystander is still alive"
    );
    assert!(alive(host_gpu), "the host's GPU process is untouched");
    assert_eq!(ns.host_pid(bystander), Some(bystander_host));
    let after = json(&ns.gpusleuth(&scene, &["vram", "--json"]));
    let left: Vec<u64> = classes(&after).into_keys().collect();
    let mut want = vec![bystander as u64, host_gpu as u64, local_holder as u64];
    want.sort();
    assert_eq!(left, want, "{after}");
}
