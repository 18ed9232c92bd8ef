//! A random PyTorch allocator workload (segments, blocks carved from them,
//! failed requests) for the tests of the allocator views.

use sleuth_core::testing::torch_block;
use sleuth_core::{CallEvent, Event};

fn mem(op: &str, pid: u32, tid: u32, ts: u64, dur: u64, size: Option<u64>, ptr: u64) -> CallEvent {
    CallEvent {
        size,
        ptr: Some(ptr),
        ..super::call(op, pid, tid, ts, dur)
    }
}

/// A random allocator workload of processes 100 and 200: segments made and
/// freed, blocks carved from them and freed, failed requests at both
/// levels, calls of random lengths (so they return out of their start and
/// row order), blocks completing at the very time of a call; its session
/// end.
pub fn random_allocator_workload(seed: u64) -> (Vec<Event>, u64) {
    const MIB: u64 = 1 << 20;
    let malloc = "DeviceCachingAllocator::malloc";
    let free = "DeviceCachingAllocator::free";
    let mut next = sleuth_core::testing::xorshift(seed);
    let mut events = Vec::new();
    let mut t = 1_000u64;
    // Per process: live segments (base, size, bump, returned at), live
    // blocks (key, ptr, size).
    let mut segs: [Vec<(u64, u64, u64, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut live: [Vec<(u64, u64, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut key = 0x1000u64;
    for step in 0..4_000u64 {
        let r = next();
        let p = (r % 2) as usize;
        let pid = 100 + 100 * p as u32;
        // Calls return on a 100 ns grid, blocks on a 10 ns one: many steps
        // complete at one time.
        t += 10 * (1 + r % 9);
        let dur = (t / 100 + 1 + (r >> 8) % 30) * 100 - t;
        match (r >> 20) % 16 {
            0 | 1 => {
                let size = if (r >> 30).is_multiple_of(3) {
                    20 * MIB
                } else {
                    2 * MIB
                };
                let base = 0x7f00_0000_0000 + (step << 26) + ((p as u64) << 44);
                events.push(Event::Call(mem(
                    "cudaMalloc",
                    pid,
                    pid + 1,
                    t,
                    dur,
                    Some(size),
                    base,
                )));
                segs[p].push((base, size, 0, t + dur));
            }
            2 if !segs[p].is_empty() => {
                let i = (r >> 40) as usize % segs[p].len();
                let (base, ..) = segs[p].swap_remove(i);
                events.push(Event::Call(mem("cudaFree", pid, pid, t, dur, None, base)));
            }
            3 => {
                let mut c = mem("cudaMalloc", pid, pid, t, dur, Some(80 * MIB), 0);
                c.ret = 2;
                events.push(Event::Call(c));
                let mut b = torch_block(pid, t + 1, malloc, 0, 0, 512, Some(80 * MIB));
                b.block = 0;
                events.push(Event::Block(b));
            }
            4..=7 if !live[p].is_empty() => {
                let i = (r >> 40) as usize % live[p].len();
                let (k, ptr, size) = live[p].swap_remove(i);
                events.push(Event::Block(torch_block(pid, t, free, k, ptr, size, None)));
            }
            _ => {
                let requested = 1 + (r >> 24) % (MIB / 2);
                let size = requested.div_ceil(512) * 512;
                // From a segment whose allocation returned.
                let fits = |s: &&mut (u64, u64, u64, u64)| s.2 + size <= s.1 && s.3 < t - 5;
                let Some(s) = segs[p].iter_mut().find(fits) else {
                    continue;
                };
                let ptr = s.0 + s.2;
                s.2 += size;
                key += 0x40;
                // Now and then at the very time a call returned.
                let end = match (r >> 50) % 8 {
                    0 => t.saturating_sub(10),
                    _ => t,
                };
                let b = torch_block(pid, end, malloc, key, ptr, size, Some(requested));
                events.push(Event::Block(b));
                live[p].push((key, ptr, size));
            }
        }
    }
    // The writer takes allocator events in completion order.
    events.sort_by_key(|e| match e {
        Event::Block(b) => (b.end_ns, 1),
        Event::Call(c) => (c.ts_ns, 0),
        _ => (0, 0),
    });
    (events, t + 10_000)
}

/// Process 100 keeping many blocks live at once: one 1 GiB segment, then
/// `n` 4 KiB blocks taken from it, every eighth given back, a call now and
/// then; its session end. Its allocator states grow past a megabyte of
/// JSON (the long values the writer stores in pieces).
pub fn many_live_blocks_workload(n: u64) -> (Vec<Event>, u64) {
    let (malloc, free) = (
        "DeviceCachingAllocator::malloc",
        "DeviceCachingAllocator::free",
    );
    let base = 0x7f00_0000_0000u64;
    let mut events = vec![Event::Call(mem(
        "cudaMalloc",
        100,
        100,
        1_000,
        500,
        Some(1 << 30),
        base,
    ))];
    let mut t = 2_000u64;
    for i in 0..n {
        t += 100;
        let (key, ptr) = (0x1000 + i * 0x40, base + i * 4096);
        events.push(Event::Block(torch_block(
            100,
            t,
            malloc,
            key,
            ptr,
            4096,
            Some(4000),
        )));
        if i % 8 == 7 {
            t += 100;
            events.push(Event::Block(torch_block(
                100, t, free, key, ptr, 4096, None,
            )));
        }
        if i % 1000 == 0 {
            t += 100;
            events.push(Event::Call(mem(
                "cudaMalloc",
                100,
                101,
                t,
                50,
                Some(4096),
                0x6000_0000_0000 + i * 8192,
            )));
        }
    }
    (events, t + 10_000)
}

/// The process of an event.
pub fn pid_of(e: &Event) -> u32 {
    match e {
        Event::Call(c) => c.pid,
        Event::Block(b) => b.pid,
        Event::Proc(p) => p.pid,
        Event::Wait(w) => w.pid,
        Event::Nccl(n) => n.call.pid,
    }
}

/// When an event completed: the file a rotation puts it in (a process's
/// lifecycle event at its time, a wait when it went back on CPU).
pub fn end_of(e: &Event) -> u64 {
    match e {
        Event::Call(c) => c.end_ns(),
        Event::Block(b) => b.end_ns,
        Event::Proc(p) => p.ts_ns,
        Event::Wait(w) => w.on_ns,
        Event::Nccl(n) => n.call.end_ns(),
    }
}

/// `events` written at `path` in a session from `start` to `end`, as file
/// `run`'s link says (or alone).
pub fn write(
    path: &std::path::Path,
    events: &[Event],
    span: (u64, u64),
    run: Option<sleuth_store::run_ledger::RunLink>,
) {
    write_on_clock(path, events, span, run, 0)
}

/// [`write`] on a file clock of base `clock_base_ns` (`file_clock`): the
/// events and the session as recorded by a monotonic clock that read that
/// much more (the wall clock the same).
pub fn write_on_clock(
    path: &std::path::Path,
    events: &[Event],
    (start, end): (u64, u64),
    run: Option<sleuth_store::run_ledger::RunLink>,
    clock_base_ns: u64,
) {
    let session = sleuth_store::SessionInfo {
        start_mono_ns: start,
        clock_base_ns,
        realtime_offset_ns: super::trace_fixture::session().realtime_offset_ns
            - clock_base_ns as i64,
        ..super::trace_fixture::session()
    };
    let opts = sleuth_store::WriterOptions {
        run,
        ..Default::default()
    };
    let w = sleuth_store::TraceWriter::create(path, session, opts).unwrap();
    let h = w.handle();
    for e in events {
        h.send(e.clone()).unwrap();
    }
    h.set_session_end(end).unwrap();
    drop(h);
    w.finish().unwrap();
}

/// `events` written as a run of `trace --rotate` in `dir` (created): file
/// k+1 holds the events `file_of` puts in k, its session from `bounds[k]`
/// to `bounds[k + 1]` or `end`, whichever comes first.
pub fn write_run_by(
    dir: &std::path::Path,
    events: &[Event],
    bounds: &[u64],
    end: u64,
    file_of: impl Fn(&Event) -> Option<usize>,
) {
    write_run_on_clock(dir, events, bounds, end, file_of, 0)
}

/// [`write_run_by`] on a file clock of base `clock_base_ns`.
pub fn write_run_on_clock(
    dir: &std::path::Path,
    events: &[Event],
    bounds: &[u64],
    end: u64,
    file_of: impl Fn(&Event) -> Option<usize>,
    clock_base_ns: u64,
) {
    std::fs::create_dir_all(dir).unwrap();
    let link = sleuth_store::run_ledger::RunLink::new_run();
    for k in 0..bounds.len() - 1 {
        let part: Vec<Event> = events
            .iter()
            .filter(|e| file_of(e) == Some(k))
            .cloned()
            .collect();
        let n = k as u64 + 1;
        let span = (bounds[k], bounds[k + 1].min(end));
        let path = dir.join(sleuth_store::run::part_name(n));
        write_on_clock(&path, &part, span, Some(link.for_file(n)), clock_base_ns);
    }
}

/// [`write_run_by`], each event in the file open when it completed: file
/// k+1 holds those that completed in `bounds[k]..bounds[k + 1]`.
pub fn write_run(dir: &std::path::Path, events: &[Event], bounds: &[u64], end: u64) {
    write_run_by(dir, events, bounds, end, |e| {
        let t = end_of(e);
        (0..bounds.len() - 1).find(|&k| (bounds[k]..bounds[k + 1]).contains(&t))
    });
}
