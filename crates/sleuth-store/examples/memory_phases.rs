//! Times the phases of the ledger at a moment on one trace (issue 16):
//! the open, the file's checks (the per-call tables' `quick_check` and the
//! call-row pass), the memory calls' stream alone (in stored order, then
//! sorted by SQLite), and the replay `memory --at` / MCP `memory {at_ns}`
//! make after the checks, twice.
//!
//! `cargo run --release -p sleuth-store --example memory_phases -- TRACE.db AT_OFFSET_NS`

use sleuth_store::stream::{CallQuery, MemoryTrace, StreamOrder};
use sleuth_store::{ReadBudget, StoreError, Trace, DEFAULT_READ_TIMEOUT};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(db), Some(at)) = (args.get(1), args.get(2)) else {
        return Err("usage: memory_phases TRACE.db AT_OFFSET_NS".into());
    };
    let at_offset: u64 = at.parse()?;
    let t = Instant::now();
    let trace = Trace::open(std::path::Path::new(db))?;
    let mt = MemoryTrace::open(&trace, None, ReadBudget::new(DEFAULT_READ_TIMEOUT))?;
    println!("open                 {:.3} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    mt.rows().check_totals()?;
    println!("checks               {:.3} s", t.elapsed().as_secs_f64());
    let at = mt.span.start_ns.saturating_add(at_offset);
    for order in [StreamOrder::ById, StreamOrder::ByReturn] {
        let q = CallQuery {
            ops: Some(sleuth_core::ledger::memory_op_names()),
            order,
            returned_by: Some(at),
            ..Default::default()
        };
        let t = Instant::now();
        let mut n = 0u64;
        mt.rows().for_each_call::<StoreError>(&q, |_| {
            n += 1;
            Ok(())
        })?;
        println!(
            "stream {:<13} {:.3} s ({n} memory calls)",
            format!("{order:?}"),
            t.elapsed().as_secs_f64()
        );
    }
    for rep in 1..=2 {
        let t = Instant::now();
        let ledgers = mt.ledgers(Some(at))?;
        let sites = mt.sites_streamed(&ledgers, Some(at))?;
        println!(
            "ledgers + sites #{rep}   {:.3} s ({} processes, {} sites)",
            t.elapsed().as_secs_f64(),
            ledgers.len(),
            sites.len()
        );
    }
    Ok(())
}
