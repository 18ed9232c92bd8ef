//! Ingero-schema databases built by the tests themselves, so the import is
//! tested without files from outside the repository. The tables and columns
//! are Ingero's, as documented in docs/import.md ("The Ingero schema"); the
//! events are written here, so every expected number comes from this code.
#![allow(dead_code)] // each test file uses a different subset

use rusqlite::{params, Connection};
use std::path::Path;

/// Ingero's tables, as its SQLite store creates them (the subset gpusleuth reads).
pub const INGERO_DDL: &str = "
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    timestamp  INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    tid        INTEGER NOT NULL,
    source     INTEGER NOT NULL,
    op         INTEGER NOT NULL,
    duration   INTEGER NOT NULL,
    gpu_id     INTEGER NOT NULL DEFAULT 0,
    arg0       INTEGER NOT NULL DEFAULT 0,
    arg1       INTEGER NOT NULL DEFAULT 0,
    ret_code   INTEGER NOT NULL DEFAULT 0,
    stack_hash INTEGER NOT NULL DEFAULT 0,
    stack_ips  TEXT NOT NULL DEFAULT '',
    cgroup_id  INTEGER NOT NULL DEFAULT 0);
CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE ops (
    source_id INTEGER NOT NULL, op_id INTEGER NOT NULL, name TEXT NOT NULL,
    description TEXT NOT NULL, PRIMARY KEY (source_id, op_id));
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started_at INTEGER NOT NULL,
    stopped_at INTEGER NOT NULL DEFAULT 0, gpu_model TEXT NOT NULL DEFAULT '',
    gpu_driver TEXT NOT NULL DEFAULT '', cpu_model TEXT NOT NULL DEFAULT '',
    cpu_cores INTEGER NOT NULL DEFAULT 0, mem_total INTEGER NOT NULL DEFAULT 0,
    kernel TEXT NOT NULL DEFAULT '', os_release TEXT NOT NULL DEFAULT '',
    cuda_ver TEXT NOT NULL DEFAULT '', python_ver TEXT NOT NULL DEFAULT '',
    ingero_ver TEXT NOT NULL DEFAULT '', pid_filter TEXT NOT NULL DEFAULT '',
    flags TEXT NOT NULL DEFAULT '');
CREATE TABLE process_names (
    pid INTEGER NOT NULL, name TEXT NOT NULL, seen_at INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pid));
CREATE TABLE event_aggregates (
    bucket INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL,
    pid INTEGER NOT NULL DEFAULT 0, count INTEGER NOT NULL DEFAULT 0,
    stored INTEGER NOT NULL DEFAULT 0, sum_dur INTEGER NOT NULL DEFAULT 0,
    min_dur INTEGER NOT NULL DEFAULT 0, max_dur INTEGER NOT NULL DEFAULT 0,
    sum_arg0 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, source, op, pid));
";

/// Ingero's source ids and the ops the fixtures use: (source, op id, name).
pub const INGERO_OPS: &[(i64, i64, &str)] = &[
    (1, 1, "cudaMalloc"),
    (1, 2, "cudaFree"),
    (1, 3, "cudaLaunchKernel"),
    (1, 5, "cudaStreamSync"),
    (1, 7, "cudaMemcpyAsync"),
    (3, 1, "sched_switch"),
    (3, 6, "process_exit"),
    (3, 7, "process_fork"),
    (4, 1, "cuLaunchKernel"),
    (4, 5, "cuMemAlloc"),
    (7, 1, "net_send"),
];

/// One Ingero event row.
#[derive(Clone, Debug)]
pub struct Row {
    pub ts: i64,
    pub pid: i64,
    pub tid: i64,
    pub source: i64,
    pub op: i64,
    pub dur: i64,
    pub arg0: i64,
    pub arg1: i64,
}

pub fn row(ts: i64, pid: i64, source: i64, op: i64, dur: i64, arg0: i64, arg1: i64) -> Row {
    Row {
        ts,
        pid,
        tid: pid,
        source,
        op,
        dur,
        arg0,
        arg1,
    }
}

/// Creates an Ingero-schema database at `path` holding `rows`, the op names
/// above, a session, process names and an aggregate.
pub fn write_ingero(path: &Path, rows: &[Row]) -> Connection {
    let c = Connection::open(path).expect("create fixture");
    c.execute_batch(INGERO_DDL).expect("ingero schema");
    for (id, name) in [(1, "CUDA"), (3, "HOST"), (4, "DRIVER"), (7, "NET")] {
        c.execute(
            "INSERT INTO sources(id, name, description) VALUES (?1, ?2, '')",
            params![id, name],
        )
        .unwrap();
    }
    for (src, op, name) in INGERO_OPS {
        c.execute(
            "INSERT INTO ops(source_id, op_id, name, description) VALUES (?1, ?2, ?3, '')",
            params![src, op, name],
        )
        .unwrap();
    }
    let tx = c.unchecked_transaction().unwrap();
    for r in rows {
        tx.execute(
            "INSERT INTO events(timestamp, pid, tid, source, op, duration, arg0, arg1)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![r.ts, r.pid, r.tid, r.source, r.op, r.dur, r.arg0, r.arg1],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    c.execute_batch(
        "INSERT INTO sessions(started_at, stopped_at, gpu_model, gpu_driver, kernel, cuda_ver, ingero_ver)
           VALUES (1774015560000000000, 1774015660000000000, 'NVIDIA GeForce RTX 4090', '570.211.01',
                   '5.15.0-173-generic', '12.8', 'fixture');
         INSERT INTO process_names(pid, name) VALUES (2233, 'python3'), (2254, 'pt_data_worker');",
    )
    .unwrap();
    c
}

/// Adds op (CUDA, 99) with a 1 MB name and `events` events naming it, the
/// shape of the hostile file of issue 18 (a 1 MB op name in a 6.8 MB file).
pub fn add_huge_op(c: &Connection, events: u32) {
    let huge = "x".repeat(1 << 20);
    c.execute(
        "INSERT INTO ops(source_id, op_id, name, description) VALUES (1, 99, ?1, '')",
        [&huge],
    )
    .unwrap();
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO events(timestamp, pid, tid, source, op, duration)
         SELECT 1774015590000000000 + i, 2233, 2233, 1, 99, 10 FROM n",
        [events],
    )
    .unwrap();
}

/// Sizes of the DataLoader trace's allocations (pytorch-dataloader-starvation.db):
/// seven cudaMalloc, each wrapping a cuMemAlloc of the same size on the same
/// thread, and three cuMemAlloc made directly.
pub const MALLOC_SIZES: [i64; 7] = [
    2_097_152,
    419_430_400,
    2_147_483_648,
    20_971_520,
    2_097_152,
    2_147_483_648,
    2_147_483_648,
];
pub const DIRECT_DRIVER_SIZES: [i64; 3] = [1024, 131_072, 8_388_608];

/// The DataLoader trace's shape: its 7 + 10 allocations, kernel launches,
/// syncs, copies, a fork, an exit, scheduler and network events.
pub fn dataloader_rows() -> Vec<Row> {
    const T0: i64 = 1_774_015_573_000_000_000;
    const MAIN: i64 = 2233;
    let mut rows = Vec::new();
    let mut t = T0;
    for size in MALLOC_SIZES {
        rows.push(row(t, MAIN, 1, 1, 300_000, size, 0));
        rows.push(row(t + 20_000, MAIN, 4, 5, 250_000, size, 0));
        t += 1_000_000;
    }
    for size in DIRECT_DRIVER_SIZES {
        rows.push(row(t, MAIN, 4, 5, 100_000, size, 0));
        t += 1_000_000;
    }
    for i in 0..16 {
        rows.push(row(t, MAIN, 1, 3, 5_000, 0x7f00 + i, 0));
        rows.push(row(t + 1_000, MAIN, 4, 1, 3_000, 0x7f00 + i, 0));
        t += 100_000;
    }
    for _ in 0..4 {
        rows.push(row(t, MAIN, 1, 5, 2_000_000, 0, 0));
        rows.push(row(t + 3_000_000, MAIN, 1, 7, 50_000, 4096, 1));
        t += 5_000_000;
    }
    rows.push(row(t, MAIN, 3, 7, 0, 0, 2254));
    for _ in 0..5 {
        rows.push(row(t + 10, MAIN, 3, 1, 40_000, 0, MAIN));
        t += 100_000;
    }
    rows.push(row(t, 2254, 7, 1, 1_000, 64, 3));
    rows.push(row(t + 500, 2254, 3, 6, 0, 0, 0));
    rows
}
