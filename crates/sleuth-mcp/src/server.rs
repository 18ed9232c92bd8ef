//! The MCP handler: tool and prompt routing. Each tool resolves its database,
//! runs the blocking work on tokio's blocking pool, and turns the answer into
//! a text result holding JSON, or an error result with a one-line message.
//! A panic inside a tool becomes an error result too; the server keeps going.
//! Every trace tool runs under a [`ReadBudget`]: it stops at
//! [`TOOL_TIME_LIMIT`], and as soon as the client cancels the request or
//! goes away, so no work keeps a core busy for a client that gave up.

use crate::args;
use crate::{gpu_tools, trace_tools};
use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, PromptMessage, Role, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{
    prompt, prompt_handler, prompt_router, tool, tool_handler, tool_router, ErrorData, RoleServer,
    ServerHandler,
};
use serde_json::Value;
use sleuth_gpu::Sources;
use sleuth_store::ReadBudget;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Wall-clock limit of one trace tool call, counted from its arrival: the
/// time it waited for a turn ([`max_concurrent_calls`]) is part of it.
pub const TOOL_TIME_LIMIT: Duration = Duration::from_secs(30);

/// How many trace tool calls run at once: the CPUs, at least 2 and at most 8.
/// Calls past it wait for a turn, in order of arrival. Before this bound,
/// 300 `findings` calls sent at once on a 200k-call trace all ran together
/// (227 hit the time limit, about 1 GB at the peak).
pub fn max_concurrent_calls() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

/// How the server was started.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The trace database tools read unless a call names another (`--db`).
    pub db: Option<PathBuf>,
    /// A directory whose traces a call may name with `db` (`--trace-dir`).
    pub trace_dir: Option<PathBuf>,
    /// Whether `reclaim_plan` may execute (`--allow-reclaim`).
    pub allow_reclaim: bool,
    /// Where the GPU tools look (NVML library, `/proc`, device-file prefix).
    pub gpu_sources: Sources,
}

/// gpusleuth's MCP server. Cheap to clone (one per HTTP session).
#[derive(Clone)]
pub struct SleuthServer {
    opts: Arc<ServerOptions>,
    /// The turns of trace tool calls, shared by every clone.
    turns: Arc<Semaphore>,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
}

type ToolResult = Result<CallToolResult, ErrorData>;

impl SleuthServer {
    pub fn new(opts: ServerOptions) -> Self {
        SleuthServer {
            opts: Arc::new(opts),
            turns: Arc::new(Semaphore::new(max_concurrent_calls())),
            tool_router: Self::tool_router(),
            prompt_router: Self::prompt_router(),
        }
    }

    /// Runs a trace tool against the resolved database, under a budget that
    /// the client's cancellation (`ctx`) and [`TOOL_TIME_LIMIT`] both stop.
    async fn on_db<F>(
        &self,
        db_arg: Option<String>,
        ctx: RequestContext<RoleServer>,
        f: F,
    ) -> ToolResult
    where
        F: FnOnce(&Path, &ReadBudget) -> anyhow::Result<Value> + Send + 'static,
    {
        let served = trace_tools::Served {
            db: self.opts.db.clone(),
            dir: self.opts.trace_dir.clone(),
        };
        // The limit counts from the call's arrival, its wait for a turn included.
        let arrived = tokio::time::Instant::now();
        let budget = ReadBudget::new(TOOL_TIME_LIMIT);
        let turn = match wait_for_turn(
            &self.turns,
            max_concurrent_calls(),
            arrived,
            TOOL_TIME_LIMIT,
            ctx.ct.clone().cancelled_owned(),
        )
        .await
        {
            Ok(turn) => turn,
            Err(refused) => return Ok(refused),
        };
        let work = budget.clone();
        let job = move || {
            let _turn = turn;
            let db = trace_tools::resolve_db(db_arg.as_deref(), &served)?;
            let answer = f(&db, &work);
            trace_tools::save_checks();
            answer
        };
        let result = run_cancellable(job, budget, ctx.ct.clone().cancelled_owned()).await;
        // A failed call (SQLite's heap cap, a time limit) or the last call
        // running gives the memory it freed back to the system, off the
        // caller's path (`crate::release_freed_memory`).
        let failed = result.as_ref().map_or(true, |r| r.is_error == Some(true));
        if failed || self.turns.available_permits() == max_concurrent_calls() {
            tokio::task::spawn_blocking(crate::release_freed_memory);
        }
        result
    }

    /// [`Self::on_db`] for a trace tool that takes its whole argument struct
    /// (`db_arg` is the struct's own `db`).
    async fn on_args<A, F>(
        &self,
        db_arg: Option<String>,
        a: A,
        ctx: RequestContext<RoleServer>,
        f: F,
    ) -> ToolResult
    where
        A: Send + 'static,
        F: FnOnce(&Path, &A, &ReadBudget) -> anyhow::Result<Value> + Send + 'static,
    {
        self.on_db(db_arg, ctx, move |db, b| f(db, &a, b)).await
    }
}

/// Waits for a turn to run a trace tool call (`turns`: at most
/// [`max_concurrent_calls`] at once) until `limit` after `arrived`. A call
/// that spent its whole limit waiting, or whose caller gave up, gets an
/// error result naming why; nothing of it was read.
async fn wait_for_turn(
    turns: &Arc<Semaphore>,
    size: usize,
    arrived: tokio::time::Instant,
    limit: Duration,
    cancelled: impl Future<Output = ()> + Send,
) -> Result<OwnedSemaphorePermit, CallToolResult> {
    let refused = |why: String| CallToolResult::error(vec![ContentBlock::text(why)]);
    let busy = || {
        refused(format!(
            "time limit of {limit:?} exceeded while waiting for a turn: the server runs at most {} \
             tool calls at once and was busy with others the whole time; nothing was read, ask again later",
            size
        ))
    };
    tokio::select! {
        biased;
        () = cancelled => Err(refused("cancelled: the caller gave up (before the call's turn came)".into())),
        turn = turns.clone().acquire_owned() => match turn {
            // A turn that came as the limit passed is no use to the call.
            Ok(_) if arrived.elapsed() >= limit => Err(busy()),
            Ok(turn) => Ok(turn),
            Err(_) => Err(refused("internal error: the server's turns are closed".into())),
        },
        () = tokio::time::sleep_until(arrived + limit) => Err(busy()),
    }
}

/// Runs blocking work under `budget`; when `cancelled` resolves first (the
/// client cancelled or disconnected), the budget is cancelled, which
/// interrupts every SQLite read of the work, and the work's end is awaited.
async fn run_cancellable<F>(
    f: F,
    budget: ReadBudget,
    cancelled: impl Future<Output = ()> + Send,
) -> ToolResult
where
    F: FnOnce() -> anyhow::Result<Value> + Send + 'static,
{
    let mut job = tokio::task::spawn_blocking(f);
    let joined = tokio::select! {
        r = &mut job => r,
        () = cancelled => {
            budget.cancel();
            job.await
        }
    };
    Ok(tool_result(joined))
}

/// Runs blocking work off the async threads; every outcome is a tool result.
async fn run_blocking<F>(f: F) -> ToolResult
where
    F: FnOnce() -> anyhow::Result<Value> + Send + 'static,
{
    Ok(tool_result(tokio::task::spawn_blocking(f).await))
}

fn tool_result(joined: Result<anyhow::Result<Value>, tokio::task::JoinError>) -> CallToolResult {
    match joined {
        Ok(Ok(v)) => CallToolResult::success(vec![ContentBlock::text(v.to_string())]),
        Ok(Err(e)) => CallToolResult::error(vec![ContentBlock::text(format!("{e:#}"))]),
        Err(join) => CallToolResult::error(vec![ContentBlock::text(format!(
            "internal error in the tool ({join}); the server is still running"
        ))]),
    }
}

#[tool_router]
impl SleuthServer {
    #[tool(
        description = "Overview of a trace: session (host, kernel, command, target), time range, \
        processes with their call counts, event counts, dropped events, probed CUDA libraries, notes. Start here. \
        On a run's directory (trace --rotate) also its files, each with its time range."
    )]
    async fn overview(
        &self,
        Parameters(a): Parameters<args::DbOnly>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_db(a.db, ctx, trace_tools::overview).await
    }

    #[tool(
        description = "Per-op latency statistics (count, errors, nearest-rank p50/p95/p99 (within 0.05% of exact on a finished trace's rollups), exact max, total) with the \
        time split on-CPU / runnable (waiting for a CPU held by named culprit processes) / blocked (sleeping, \
        e.g. waiting for the GPU). Filters: pid, op, since_ns/until_ns (monotonic ns) or last_ns (the last part \
        of the trace). On a run's directory: over its files (whole, or last_ns)."
    )]
    async fn latency_stats(
        &self,
        Parameters(a): Parameters<args::CallScope>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::latency_stats)
            .await
    }

    #[tool(
        description = "Ranked, evidence-backed findings (what `gpusleuth explain` prints): CPU preemption \
        with culprits, GPU waits, failed allocations, unfreed memory, allocation churn, tail latency. \
        All arguments optional (pid, op, since_ns/until_ns or last_ns narrow the calls considered). \
        On a run's directory: over its files (whole, or last_ns; pid)."
    )]
    async fn findings(
        &self,
        Parameters(a): Parameters<args::CallScope>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::findings)
            .await
    }

    #[tool(
        description = "The slowest calls (of one op if given), slowest first, each with its on-CPU / \
        runnable / blocked split and the tasks that held the CPU while it waited (culprits). \
        On a run's directory: the slowest of all its files, each naming its file."
    )]
    async fn slow_calls(
        &self,
        Parameters(a): Parameters<args::SlowCalls>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::slow_calls)
            .await
    }

    #[tool(
        description = "GPU memory ledger per process: live and peak device bytes, unfreed allocations, \
        failed allocations (with the live bytes when they failed), pinned/managed memory apart, a thinned \
        timeline, and `held`: what NVML said the process held before the trace began (allocations made \
        before the trace are not itemized). `at_ns` gives the ledger as it stood at that moment. \
        On a run's directory: the run's ledger over its files (at `at_ns`: replayed from the files begun by then). \
        Past 32 processes: those still running or with a failed allocation, then the 10 others with the highest \
        peaks; `processes_omitted` counts the rest (`pid` lists one)."
    )]
    async fn memory(
        &self,
        Parameters(a): Parameters<args::Memory>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::memory)
            .await
    }

    #[tool(
        description = "GPU activity NVML sampled during the trace: busy per GPU (share of each sample period \
        some kernel ran; not SM occupancy) summarised and as a time series, and per traced process the device \
        memory the driver attributed to it (start = when its tracing began, the memory it held before the \
        trace) and its SM use where reported. measured: false when NVML was not available. \
        On a run's directory: over its finished files."
    )]
    async fn gpu_activity(
        &self,
        Parameters(a): Parameters<args::DbOnly>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_db(a.db, ctx, trace_tools::gpu_activity).await
    }

    #[tool(
        description = "Call sites (Python file:line function, or native function and library) captured at \
        allocations, frees, failed and slow calls: device memory by site (allocated, unfreed, live at the \
        peak, failed) with an example stack, calls by site and op, and the sites of failed allocations. \
        On a run's directory: over its finished files (live at the peak is not known over several files)."
    )]
    async fn call_sites(
        &self,
        Parameters(a): Parameters<args::CallSites>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, crate::site_tools::call_sites)
            .await
    }

    #[tool(
        description = "Every event of one process (CUDA calls, off-CPU waits with culprits, fork/exec/exit) \
        in the window [at_ns - window_ns, at_ns + window_ns), oldest first, capped by `limit`. \
        On a run's directory: from the files the window overlaps."
    )]
    async fn timeline(
        &self,
        Parameters(a): Parameters<args::Timeline>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::timeline)
            .await
    }

    #[tool(
        description = "Run ONE read-only SQL statement on the trace database (tables: session, stats, \
        processes, proc_events, calls, waits, wait_culprits, call_culprits, op_counts, libraries, notes, meta). \
        Writes, ATTACH, PRAGMA changes and extensions are refused; rows are capped; 2 s time limit."
    )]
    async fn sql(
        &self,
        Parameters(a): Parameters<args::Sql>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.on_args(a.db.clone(), a, ctx, trace_tools::sql).await
    }

    #[tool(
        description = "Live view of this machine's GPUs: memory per GPU from NVML and every process holding \
        GPU memory or device files, classified (active, exited but still listed, orphaned worker, ...)."
    )]
    async fn gpu_holders(&self, Parameters(_): Parameters<args::NoArgs>) -> ToolResult {
        let opts = self.opts.clone();
        run_blocking(move || gpu_tools::gpu_holders(&opts.gpu_sources)).await
    }

    #[tool(
        description = "Plan to free GPU memory held by stuck or orphaned processes: targets, refusals \
        (never pid 1, kernel threads, this server or its ancestors, other users), bytes expected to be freed. \
        A dry run unless execute=true AND the server was started with --allow-reclaim."
    )]
    async fn reclaim_plan(&self, Parameters(a): Parameters<args::Reclaim>) -> ToolResult {
        let opts = self.opts.clone();
        run_blocking(move || gpu_tools::reclaim_plan(&opts.gpu_sources, &a, opts.allow_reclaim))
            .await
    }
}

/// The steps the `investigate` prompt walks an assistant through.
const INVESTIGATE_STEPS: &str = "Investigate this CUDA trace with the gpusleuth tools, in this order:\n\
1. Call `overview`: note the processes, the time range, and whether any events were dropped \
(drops make every count a lower bound; say so).\n\
2. Call `findings`: these are ranked and each carries its evidence. Treat them as hypotheses to check.\n\
3. For each important finding, fetch the evidence: `latency_stats` (filtered by its op and pid) for the \
on-CPU / runnable / blocked split; `slow_calls` for the worst calls and the processes that held the CPU \
(culprits); `memory` for allocation failures or unfreed memory (use `at_ns` to see the ledger at the failure); \
`timeline` around a slow call's ts_ns to see what the process did just before.\n\
4. Only runnable time is CPU contention; blocked time in a sync call is the host waiting for the GPU, \
not the OS's fault. Do not blame a culprit for blocked time.\n\
5. Use `sql` only for questions the other tools cannot answer (one read-only SELECT).\n\
6. Answer with: the verdict, the numbers that support it (with units), the culprit processes by pid and \
name, and a concrete recommendation. If the trace is clean, say so.";

#[prompt_router]
impl SleuthServer {
    #[prompt(
        name = "investigate",
        description = "Walks an assistant through overview -> findings -> evidence \
        to explain why a CUDA program was slow or where its GPU memory went."
    )]
    async fn investigate(
        &self,
        Parameters(a): Parameters<args::Investigate>,
    ) -> Vec<PromptMessage> {
        let mut text = String::from(INVESTIGATE_STEPS);
        if let Some(q) = a.question.filter(|q| !q.trim().is_empty()) {
            text.push_str("\n\nThe user's question: ");
            text.push_str(q.trim());
        }
        vec![PromptMessage::new_text(Role::User, text)]
    }
}

#[tool_handler(router = self.tool_router)]
#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for SleuthServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_prompts().build())
            .with_server_info(Implementation::new("gpusleuth", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "gpusleuth explains why a CUDA program was slow and where its GPU memory went, from an eBPF \
                 trace database, and shows who holds GPU memory now. Start with `overview`, then `findings`; \
                 the `investigate` prompt describes the whole method. Timestamps are monotonic ns.",
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_store::{run_readonly_sql_with, SqlLimits};
    use std::time::Instant;

    fn example() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db")
    }

    /// Issue 18: a client that gave up must not leave a core busy. The
    /// query below has no time limit of its own (600 s); only the
    /// cancellation can stop it.
    #[tokio::test(flavor = "multi_thread")]
    async fn cancellation_reaches_the_work() {
        let budget = ReadBudget::new(Duration::from_secs(600));
        let work = budget.clone();
        let db = example();
        let t0 = Instant::now();
        let r = run_cancellable(
            move || {
                let limits = SqlLimits {
                    timeout: Duration::from_secs(600),
                    ..SqlLimits::default()
                };
                let q = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r";
                let res = run_readonly_sql_with(&db, q, &limits, &work)?;
                Ok(serde_json::to_value(res)?)
            },
            budget,
            tokio::time::sleep(Duration::from_millis(300)),
        )
        .await
        .expect("a tool result");
        let took = t0.elapsed();
        assert_eq!(r.is_error, Some(true), "{r:?}");
        assert!(took < Duration::from_secs(3), "stopped after {took:?}");
        let text = format!("{r:?}");
        assert!(text.contains("cancelled"), "{text}");
    }

    /// At most the turns' size of calls run at once; the others wait and
    /// then run (none is lost).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn calls_past_the_limit_wait_for_a_turn() {
        let turns = Arc::new(Semaphore::new(2));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (turns, running, most) = (turns.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let arrived = tokio::time::Instant::now();
                let never = std::future::pending::<()>();
                let turn = wait_for_turn(&turns, 2, arrived, Duration::from_secs(600), never)
                    .await
                    .expect("a turn");
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                drop(turn);
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A call that spent its whole limit waiting fails with a message
    /// saying so; one whose caller gave up while waiting says that.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_call_that_waited_out_its_limit_fails_clearly() {
        let turns = Arc::new(Semaphore::new(1));
        let _held = turns.clone().acquire_owned().await.expect("the one turn");
        let arrived = tokio::time::Instant::now();
        let never = std::future::pending::<()>();
        let r = wait_for_turn(&turns, 1, arrived, Duration::from_millis(100), never)
            .await
            .expect_err("no turn came");
        let text = format!("{r:?}");
        assert!(text.contains("while waiting for a turn"), "{text}");
        assert!(text.contains("at most 1 tool calls at once"), "{text}");
        assert_eq!(r.is_error, Some(true));
        let gave_up = tokio::time::sleep(Duration::from_millis(50));
        let r = wait_for_turn(&turns, 1, arrived, Duration::from_secs(600), gave_up)
            .await
            .expect_err("cancelled");
        assert!(format!("{r:?}").contains("cancelled"));
    }
}
