//! `gpusleuth vram`: who holds GPU memory right now (NVML + /proc), with a
//! classification a person understands. Rendering only; the rules live in sleuth-gpu.

use crate::output::fmt_bytes;
use crate::term_text::terminal_safe;
use anyhow::Context;
use sleuth_gpu::classify::{Class, Holder, Report};
use sleuth_gpu::Sources;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    out: crate::args::JsonOutput,
    /// Refresh periodically: in place on a terminal, one line per refresh otherwise.
    #[arg(long)]
    watch: bool,
    /// Time between refreshes with --watch (e.g. 2s, 500ms).
    #[arg(long, default_value = "2s", value_parser = crate::args::positive_duration, requires = "watch")]
    interval: Duration,
    /// Stop after this many refreshes with --watch (0 = until interrupted).
    #[arg(long, default_value_t = 0, requires = "watch")]
    count: u64,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let sources = Sources::from_env();
    if let Some(note) = &sources.seam_note {
        eprintln!("gpusleuth: {note}");
    }
    if !args.watch {
        let report = sources.observe().report;
        crate::load::emit(&shown(&report, args.out.json)?)?;
        return Ok(0);
    }
    watch(&sources, &args)
}

/// The report as printed: JSON, or text with the names other users'
/// processes gave themselves made safe for a terminal.
fn shown(report: &Report, json: bool) -> anyhow::Result<String> {
    Ok(match json {
        true => serde_json::to_string(report).context("writing JSON")? + "\n",
        false => terminal_safe(&render(report)).into_owned(),
    })
}

/// Repeats the report; remembers which exited-but-listed pids it already flagged.
fn watch(sources: &Sources, args: &Args) -> anyhow::Result<i32> {
    let tty = std::io::stdout().is_terminal() && !args.out.json;
    let start = Instant::now();
    let mut flagged: BTreeSet<u32> = BTreeSet::new();
    let mut flags: Vec<String> = Vec::new();
    let mut n = 0u64;
    loop {
        let report = sources.observe().report;
        let t = start.elapsed().as_secs_f64();
        let mut fresh = Vec::new();
        for h in report
            .holders
            .iter()
            .filter(|h| h.class == Class::ExitedButListed)
        {
            if flagged.insert(h.pid) {
                fresh.push(format!("[t+{t:.1}s] FLAG: {}", held_after_death(h)));
            }
        }
        // Pids that stopped being listed can be flagged again if they come back.
        let listed_dead: BTreeSet<u32> = report
            .holders
            .iter()
            .filter(|h| h.class == Class::ExitedButListed)
            .map(|h| h.pid)
            .collect();
        flagged.retain(|p| listed_dead.contains(p));

        let mut out = String::new();
        if args.out.json {
            out = shown(&report, true)?;
        } else if tty {
            flags.extend(fresh);
            // Home + clear, then the whole frame: refresh in place.
            let _ = write!(
                out,
                "\x1b[H\x1b[2J[t+{t:.1}s] gpusleuth vram --watch (Ctrl-C to stop)\n{}",
                terminal_safe(&render(&report))
            );
            for f in flags.iter().rev().take(10) {
                let _ = writeln!(out, "{}", terminal_safe(f));
            }
        } else {
            let _ = writeln!(out, "[t+{t:.1}s] {}", terminal_safe(&one_line(&report)));
            for f in fresh {
                let _ = writeln!(out, "{}", terminal_safe(&f));
            }
        }
        // A closed pipe (`| head`) ends the watch.
        if !crate::load::emit_open(&out)? {
            return Ok(0);
        }
        n += 1;
        if args.count != 0 && n >= args.count {
            return Ok(0);
        }
        std::thread::sleep(args.interval);
    }
}

fn held_after_death(h: &Holder) -> String {
    let mem: Vec<String> = h
        .gpus
        .iter()
        .map(|g| {
            format!(
                "{} on GPU {}",
                g.used_bytes
                    .map(fmt_bytes)
                    .unwrap_or_else(|| "unknown".into()),
                g.gpu
            )
        })
        .collect();
    format!(
        "memory held after its process died: pid {} is gone, NVML still lists {}; {}",
        h.pid,
        mem.join(", "),
        h.reason
    )
}

/// A compact summary for non-terminal watch output.
fn one_line(r: &Report) -> String {
    let mut parts: Vec<String> = r
        .gpus
        .iter()
        .map(|g| {
            format!(
                "gpu{} used={} listed={}",
                g.device.index,
                fmt_bytes(g.device.used_bytes),
                g.device.processes.len()
            )
        })
        .collect();
    if !r.nvml.available {
        parts.push("nvml=unavailable".into());
    }
    let count = |c: Class| r.holders.iter().filter(|h| h.class == c).count();
    parts.push(format!(
        "holders={} active={} exited_but_listed={} orphaned={} zombie={} d_state={}",
        r.holders.len(),
        count(Class::Active),
        count(Class::ExitedButListed),
        count(Class::OrphanedWorker),
        count(Class::Zombie),
        count(Class::StuckD)
    ));
    parts.join(" ")
}

fn holder_row(h: &Holder, gpu: Option<u32>) -> String {
    let mem = match gpu {
        Some(g) => h
            .gpus
            .iter()
            .find(|u| u.gpu == g)
            .and_then(|u| u.used_bytes)
            .map(fmt_bytes),
        None => (!h.gpus.is_empty()).then(|| fmt_bytes(h.nvml_bytes())),
    }
    .unwrap_or_else(|| "-".into());
    let known: Vec<&str> = h
        .known_by
        .iter()
        .map(|s| match s {
            sleuth_gpu::classify::Source::Nvml => "nvml",
            sleuth_gpu::classify::Source::OpenFds => "fds",
            sleuth_gpu::classify::Source::Mappings => "maps",
        })
        .collect();
    let (state, user, ppid, started, cg, cmd) = match &h.process {
        Some(p) => (
            format!("{:?}", p.state).to_lowercase(),
            p.user.clone(),
            p.ppid.to_string(),
            p.started_unix
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into()),
            p.container
                .clone()
                .map(|c| format!("container {c}"))
                .unwrap_or_else(|| p.cgroup.clone()),
            if p.cmdline.is_empty() {
                format!("[{}]", p.comm)
            } else {
                p.cmdline.clone()
            },
        ),
        None => (
            "gone".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ),
    };
    let mut s = format!(
        "  {:>7}  {:<17}  {:>10}  {:<10} {:<8} ppid {:<7} start {:<10}  via {:<13} {}\n           {}  cgroup {}\n",
        h.pid,
        h.class.as_str(),
        mem,
        state,
        user,
        ppid,
        started,
        known.join("+"),
        truncate(&cmd, 60),
        h.reason,
        cg
    );
    if let Some(p) = h.process.as_ref().filter(|p| p.nspid.len() > 1) {
        s.push_str(&format!(
            "           pid in its own namespaces (NSpid): {:?}\n",
            p.nspid
        ));
    }
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// The human report: one block per GPU with its holders, then the rest.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    if let Some(why) = &r.nvml.reason {
        s.push_str(&format!(
            "NVML not available: {why}; showing /proc holders only\n"
        ));
    } else if let Some(d) = &r.nvml.driver {
        s.push_str(&format!("NVML driver {d}\n"));
    }
    let mut shown = BTreeSet::new();
    for g in &r.gpus {
        let d = &g.device;
        s.push_str(&format!(
            "GPU {}  {}  {}  used {} / {} (free {})\n",
            d.index,
            d.name,
            d.uuid,
            fmt_bytes(d.used_bytes),
            fmt_bytes(d.total_bytes),
            fmt_bytes(d.free_bytes)
        ));
        s.push_str(&format!(
            "  listed by NVML {}, not attributed to a listed pid {} (driver overhead included)",
            fmt_bytes(g.listed_bytes),
            fmt_bytes(g.unattributed_bytes)
        ));
        if g.held_by_nobody_visible_bytes > 0 {
            s.push_str(&format!(
                ", held by nobody visible {}",
                fmt_bytes(g.held_by_nobody_visible_bytes)
            ));
        }
        s.push('\n');
        for h in r.holders.iter().filter(|h| g.holder_pids.contains(&h.pid)) {
            shown.insert(h.pid);
            s.push_str(&holder_row(h, Some(d.index)));
        }
    }
    let rest: Vec<&Holder> = r
        .holders
        .iter()
        .filter(|h| !shown.contains(&h.pid))
        .collect();
    if !rest.is_empty() {
        s.push_str(if r.gpus.is_empty() {
            "Processes holding GPU device files:\n"
        } else {
            "Holders of shared device files (nvidiactl, nvidia-uvm, caps), not tied to one GPU:\n"
        });
        for h in rest {
            s.push_str(&holder_row(h, None));
        }
    }
    if r.holders.is_empty() {
        s.push_str("No process holds GPU memory or GPU device files.\n");
    }
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    s
}
