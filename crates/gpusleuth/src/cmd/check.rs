//! `gpusleuth check`: can this machine trace CUDA, and what would be traced.

use anyhow::Result;
use serde::Serialize;
use sleuth_probe::discover;
use std::path::Path;

#[derive(clap::Args)]
pub struct Args {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also try loading and attaching the eBPF programs (needs root).
    #[arg(long)]
    pub load: bool,
}

#[derive(Serialize)]
struct Item {
    name: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Serialize)]
struct Report {
    ready: bool,
    checks: Vec<Item>,
    libraries: Vec<Lib>,
}

#[derive(Serialize)]
struct Lib {
    path: String,
    layer: &'static str,
}

fn tracefs_status() -> (bool, String) {
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(2) == Some("tracefs")))
        .unwrap_or(false);
    if mounted {
        return (true, "mounted".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && Path::new("/sys/kernel/tracing").is_dir() {
        let src = c"nodev";
        let dst = c"/sys/kernel/tracing";
        let fstype = c"tracefs";
        // SAFETY: all pointers are valid NUL-terminated strings; data is null.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r == 0 {
            return (
                true,
                "was not mounted; mounted it at /sys/kernel/tracing".into(),
            );
        }
    }
    // Not fatal: gpusleuth uses tp_btf and perf-event uprobes, which need no tracefs.
    (
        true,
        "not mounted (not needed: gpusleuth uses tp_btf and perf-event uprobes)".into(),
    )
}

fn nvml_status() -> (bool, String) {
    let candidates = [
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/lib/libnvidia-ml.so.1",
    ];
    if let Ok(p) = std::env::var("GPUSLEUTH_NVML_LIB") {
        return (Path::new(&p).exists(), format!("GPUSLEUTH_NVML_LIB={p}"));
    }
    match candidates.iter().find(|p| Path::new(p).exists()) {
        Some(p) => (true, format!("found {p}")),
        None => (
            false,
            "libnvidia-ml.so.1 not found: `vram`/`reclaim` will show /proc holders only".into(),
        ),
    }
}

pub fn run(args: Args) -> Result<i32> {
    let mut checks = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = kernel.trim();
    let (maj, min) = {
        let mut it = kernel
            .split(['.', '-'])
            .map(|s| s.parse::<u32>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    checks.push(Item {
        name: "kernel",
        ok: (maj, min) >= (5, 15),
        detail: format!(
            "{kernel} (5.15 or newer needed: ring buffer, tp_btf, uprobe attach cookies)"
        ),
    });
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    checks.push(Item {
        name: "btf",
        ok: btf,
        detail: if btf {
            "/sys/kernel/btf/vmlinux present".into()
        } else {
            "no kernel BTF: CO-RE programs cannot load".into()
        },
    });
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    checks.push(Item {
        name: "privileges",
        ok: root,
        detail: if root {
            "running as root".into()
        } else {
            "not root: `trace` needs root (or CAP_BPF+CAP_PERFMON); vram/stats/explain work without"
                .into()
        },
    });
    let (tok, tdetail) = tracefs_status();
    checks.push(Item {
        name: "tracefs",
        ok: tok,
        detail: tdetail,
    });
    let (nok, ndetail) = nvml_status();
    checks.push(Item {
        name: "nvml",
        ok: nok,
        detail: ndetail,
    });

    let env: Vec<(String, String)> = std::env::vars().collect();
    let libs = discover::scan_standard(&discover::env_dirs(&env));
    checks.push(Item {
        name: "cuda_libraries",
        ok: !libs.is_empty(),
        detail: if libs.is_empty() {
            "no libcudart/libcuda found in standard places; they are also picked up from traced processes' memory maps, or give --cuda-lib".into()
        } else {
            format!("{} found", libs.len())
        },
    });
    // PyTorch's caching allocator (trace --torch-allocator).
    for lib in libs.iter().filter(|l| l.layer == sleuth_core::Layer::Torch) {
        let found = sleuth_probe::symbols::SymbolOffsets::read_torch(&lib.path)
            .map(|s| s.offsets.len())
            .unwrap_or(0);
        let wanted = sleuth_core::ops::ops_of(sleuth_core::Layer::Torch).count();
        let mut detail = format!(
            "{}: {found} of {wanted} caching-allocator entry points found",
            lib.path.display()
        );
        if found < wanted {
            detail.push_str(" (this torch build differs: --torch-allocator will fall back to the CUDA-level view); candidates:");
            for c in sleuth_probe::symbols::torch_candidates(&lib.path)
                .iter()
                .take(12)
            {
                detail.push_str("\n        ");
                detail.push_str(c);
            }
        }
        checks.push(Item {
            name: "torch_allocator",
            ok: found == wanted,
            detail,
        });
    }
    // NCCL (collectives, communicators): optional, reported like the CUDA libraries.
    for lib in libs.iter().filter(|l| l.layer == sleuth_core::Layer::Nccl) {
        let syms = sleuth_probe::symbols::SymbolOffsets::read(&lib.path);
        let wanted: Vec<&str> = sleuth_core::ops::ops_of(sleuth_core::Layer::Nccl)
            .map(|o| o.name)
            .collect();
        let missing: Vec<&str> = match &syms {
            Ok(s) => wanted
                .iter()
                .copied()
                .filter(|n| s.get(n).is_none())
                .collect(),
            Err(_) => wanted.clone(),
        };
        let mut detail = format!(
            "{}: {} of {} NCCL entry points found",
            lib.path.display(),
            wanted.len() - missing.len(),
            wanted.len()
        );
        if let Err(e) = &syms {
            detail.push_str(&format!(" (cannot read symbols: {e})"));
        } else if !missing.is_empty() {
            detail.push_str(&format!(" (missing: {})", missing.join(", ")));
        }
        checks.push(Item {
            name: "nccl",
            ok: missing.len() < wanted.len(),
            detail,
        });
    }
    if args.load {
        let r = sleuth_probe::Capture::start(false, sleuth_probe::LaunchMode::Driver);
        checks.push(Item {
            name: "ebpf_load",
            ok: r.is_ok(),
            detail: match r {
                Ok(_) => "programs loaded and scheduler tracepoints attached".into(),
                Err(e) => e.to_string(),
            },
        });
    }
    let ready = checks
        .iter()
        .filter(|c| c.name != "nvml" && c.name != "cuda_libraries" && c.name != "nccl")
        .all(|c| c.ok);
    let report = Report {
        ready,
        checks,
        libraries: libs
            .iter()
            .map(|l| Lib {
                path: l.path.display().to_string(),
                layer: l.layer.as_str(),
            })
            .collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &report.checks {
            println!(
                "{:<5} {:<15} {}",
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        for l in &report.libraries {
            println!("      {:<15} {} ({})", "", l.path, l.layer);
        }
        println!(
            "{}",
            if report.ready {
                "verdict: ready to trace"
            } else {
                "verdict: NOT ready to trace (see FAIL lines)"
            }
        );
    }
    Ok(if report.ready { 0 } else { 1 })
}
