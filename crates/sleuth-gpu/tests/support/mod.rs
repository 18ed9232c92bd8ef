//! Shared by sleuth-gpu's and gpusleuth's integration tests: builds the
//! simulated NVML and the holder workload with gcc, and sets up a private
//! scene (stand-in device files, scenario file) per test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Fixtures {
    pub sim_nvml: PathBuf,
    pub holder: PathBuf,
}

fn fixtures_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sleuth-gpu/tests/fixtures")
}

fn gcc(args: &[&str]) {
    let st = Command::new("gcc").args(args).status().expect(
        "gcc is required to build the simulated NVML (TESTING.md: gcc is on every machine)",
    );
    assert!(st.success(), "gcc {args:?} failed");
}

/// Builds both fixtures once per test binary, into a folder unique to this process.
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("sleuth-gpu-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(&out).expect("fixture dir");
        let src = fixtures_src();
        let lib = out.join("libnvidia-ml.so.1");
        let holder = out.join("holder");
        gcc(&[
            "-O1",
            "-shared",
            "-fPIC",
            "-o",
            lib.to_str().unwrap(),
            src.join("sim_nvml.c").to_str().unwrap(),
        ]);
        gcc(&[
            "-O1",
            "-o",
            holder.to_str().unwrap(),
            src.join("holder.c").to_str().unwrap(),
        ]);
        Fixtures {
            sim_nvml: lib,
            holder,
        }
    })
}

/// One test's private world: stand-in `/dev/nvidia*` files and an NVML scenario.
pub struct Scene {
    pub dir: PathBuf,
    pub dev_prefix: String,
    pub scenario: PathBuf,
    children: Vec<Child>,
    extra_pids: Vec<u32>,
}

impl Scene {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpusleuth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scene dir");
        for f in ["nvidia0", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(dir.join(f), vec![0u8; 4096]).expect("stand-in device file");
        }
        Scene {
            dev_prefix: dir.join("nvidia").to_string_lossy().into_owned(),
            scenario: dir.join("scenario.txt"),
            dir,
            children: Vec::new(),
            extra_pids: Vec::new(),
        }
    }

    pub fn devices(&self) -> Vec<String> {
        ["nvidia0", "nvidiactl", "nvidia-uvm"]
            .iter()
            .map(|f| self.dir.join(f).to_string_lossy().into_owned())
            .collect()
    }

    pub fn write_scenario(&self, text: &str) {
        std::fs::write(&self.scenario, text).expect("scenario");
    }

    /// Starts the holder in its own process group; returns the pids it printed.
    pub fn spawn(&mut self, mode: &str, files: &[String]) -> Vec<u32> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(&fixtures().holder)
            .arg(mode)
            .args(files)
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("holder ready line");
        let pids: Vec<u32> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|s| s.parse().ok())
            .collect();
        assert!(
            line.starts_with("ready") && !pids.is_empty(),
            "holder said {line:?}"
        );
        self.extra_pids.extend(pids.iter().skip(1));
        self.children.push(child);
        pids
    }

    /// SIGKILLs the direct child `pid` and reaps it, so it is gone from `/proc`.
    pub fn kill_and_reap(&mut self, pid: u32) {
        let i = self
            .children
            .iter()
            .position(|c| c.id() == pid)
            .expect("direct child");
        let mut c = self.children.remove(i);
        c.kill().expect("kill");
        c.wait().expect("reap");
    }

    /// Reaps a direct child that something else ended.
    pub fn reap(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(i);
            let _ = c.wait();
        }
    }

    pub fn env(&self, cmd: &mut Command) {
        cmd.env("GPUSLEUTH_DEV_PREFIX", &self.dev_prefix)
            .env("GPUSLEUTH_NVML_LIB", &fixtures().sim_nvml)
            .env("SIM_NVML_SCENARIO", &self.scenario);
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Workers are not our children; they only hold this scene's files, so
        // ending them by pid is safe while their start matches (checked by state).
        for &pid in &self.extra_pids {
            if state(pid).is_some_and(|s| s != 'Z') && holds_prefix(pid, &self.dev_prefix) {
                // SAFETY: plain kill(2) on a pid we verified still holds this test's files.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// State letter of a process, `None` when it is gone.
pub fn state(pid: u32) -> Option<char> {
    let p = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    p.stat().ok().map(|s| s.state)
}

/// Alive = present and neither zombie nor dead.
pub fn alive(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

pub fn holds_prefix(pid: u32, prefix: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with(prefix))
            })
        })
        .unwrap_or(false)
}

/// Waits (bounded, not a timing assertion) until `cond` holds.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A reclaim ended `gone` and spared the others: waits (bounded) for `gone`
/// to go, then checks each spared pid still runs, failing with its reason.
pub fn assert_ended_only(gone: u32, spared: &[(u32, &str)]) {
    wait_until(&format!("pid {gone} to be gone"), || !alive(gone));
    for (pid, why) in spared {
        assert!(alive(*pid), "pid {pid} was ended: {why}");
    }
}

/// True on CI, where tests that need root must run rather than skip.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
