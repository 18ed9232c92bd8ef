//! `gpusleuth check`: can this machine trace CUDA, and what would be traced.

use anyhow::Result;
use serde::Serialize;
use sleuth_probe::discover;
use std::path::Path;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub out: crate::args::JsonOutput,
    /// Also try loading and attaching the eBPF programs (needs root).
    #[arg(long)]
    pub load: bool,
}

#[derive(Serialize)]
struct Item {
    name: &'static str,
    ok: bool,
    /// "ok", "warn" (tracing works, less is seen) or "fail" (tracing cannot run).
    status: &'static str,
    detail: String,
    /// What a failed check means for the user (null when ok).
    impact: Option<&'static str>,
}

/// Status and impact are filled by [`settle`] once every check ran.
const PENDING: Item = Item {
    name: "",
    ok: false,
    status: "",
    detail: String::new(),
    impact: None,
};

/// Checks whose failure stops nothing: tracing runs, it sees less.
fn optional_impact(name: &str) -> Option<&'static str> {
    match name {
        "nvml" => Some("tracing is not affected; `vram`/`reclaim` see /proc holders only, without GPU memory figures"),
        "cuda_libraries" => Some("tracing still works: libraries are found in traced processes' memory maps, or name one with --cuda-lib"),
        "torch_allocator" => Some("tracing is not affected; --torch-allocator falls back to the CUDA-level view"),
        "nccl" => Some("tracing is not affected; NCCL libraries are also found in traced processes' memory maps"),
        _ => None,
    }
}

const FAIL_IMPACT: &str = "`trace` cannot run until this is fixed";

/// Fills `status` and `impact` from `ok` and whether the check is optional.
fn settle(mut items: Vec<Item>) -> Vec<Item> {
    for i in &mut items {
        (i.status, i.impact) = match (i.ok, optional_impact(i.name)) {
            (true, _) => ("ok", None),
            (false, Some(why)) => ("warn", Some(why)),
            (false, None) => ("fail", Some(FAIL_IMPACT)),
        };
    }
    items
}

/// The closing line: what the verdict rests on.
fn verdict(items: &[Item]) -> String {
    let names = |status: &str| -> Vec<&str> {
        items
            .iter()
            .filter(|i| i.status == status)
            .map(|i| i.name)
            .collect()
    };
    let (fails, warns) = (names("fail"), names("warn"));
    let warn_part = if warns.is_empty() {
        String::new()
    } else {
        format!("; WARN ({}) only limits what is seen", warns.join(", "))
    };
    if fails.is_empty() {
        format!("verdict: ready to trace{warn_part}")
    } else {
        format!(
            "verdict: NOT ready to trace: FAIL ({}) stops `trace`{warn_part}",
            fails.join(", ")
        )
    }
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
    // The test seam, only where this build honours it (debug builds).
    if let Some(p) = sleuth_gpu::Sources::from_env().nvml_lib {
        let p = Path::new(&p);
        return (
            p.exists(),
            format!("GPUSLEUTH_NVML_LIB={} (test seam)", p.display()),
        );
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
        ..PENDING
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
        ..PENDING
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
        ..PENDING
    });
    let (tok, tdetail) = tracefs_status();
    checks.push(Item {
        name: "tracefs",
        ok: tok,
        detail: tdetail,
        ..PENDING
    });
    let (nok, ndetail) = nvml_status();
    checks.push(Item {
        name: "nvml",
        ok: nok,
        detail: ndetail,
        ..PENDING
    });

    let env = discover::process_env();
    let libs = discover::scan_standard(&discover::env_dirs(&env));
    checks.push(Item {
        name: "cuda_libraries",
        ok: !libs.is_empty(),
        detail: if libs.is_empty() {
            "no libcudart/libcuda found in standard places; they are also picked up from traced processes' memory maps, or give --cuda-lib".into()
        } else {
            format!("{} found", libs.len())
        },
        ..PENDING
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
            ..PENDING
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
            ..PENDING
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
            ..PENDING
        });
    }
    let checks = settle(checks);
    let ready = checks.iter().all(|c| c.status != "fail");
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
    if args.out.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        for c in &report.checks {
            let tag = match c.status {
                "ok" => "ok",
                "warn" => "WARN",
                _ => "FAIL",
            };
            outln!("{tag:<5} {:<15} {}", c.name, c.detail)?;
            if let Some(impact) = c.impact {
                outln!("      {:<15} -> {}: {impact}", "", c.status)?;
            }
        }
        for l in &report.libraries {
            outln!("      {:<15} {} ({})", "", l.path, l.layer)?;
        }
        outln!("{}", verdict(&report.checks))?;
    }
    Ok(if report.ready { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &'static str, ok: bool) -> Item {
        Item {
            name,
            ok,
            ..PENDING
        }
    }

    #[test]
    fn each_failing_line_says_whether_it_stops_tracing() {
        let items = settle(vec![
            item("kernel", true),
            item("nvml", false),
            item("cuda_libraries", false),
        ]);
        let st: Vec<&str> = items.iter().map(|i| i.status).collect();
        assert_eq!(st, ["ok", "warn", "warn"]);
        assert!(items[1].impact.unwrap().contains("tracing is not affected"));
        assert_eq!(
            verdict(&items),
            "verdict: ready to trace; WARN (nvml, cuda_libraries) only limits what is seen"
        );
        let items = settle(vec![item("privileges", false), item("nvml", false)]);
        assert_eq!(items[0].status, "fail");
        assert_eq!(items[0].impact, Some(FAIL_IMPACT));
        assert_eq!(
            verdict(&items),
            "verdict: NOT ready to trace: FAIL (privileges) stops `trace`; WARN (nvml) only limits what is seen"
        );
        assert_eq!(
            verdict(&settle(vec![item("btf", true)])),
            "verdict: ready to trace"
        );
    }
}
