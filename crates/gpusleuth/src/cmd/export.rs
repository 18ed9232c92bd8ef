//! `gpusleuth export`: a trace in another tool's format.
//!
//! `perfetto` writes Chrome Trace Event JSON (read by ui.perfetto.dev and
//! chrome://tracing): one track per process and thread, CUDA calls as
//! complete slices with their arguments, each off-CPU interval of a traced
//! thread as slices on that thread (`off-cpu: blocked` then `off-cpu:
//! runnable`, with the tasks that held the CPU), device memory per process
//! as a counter track, findings as instant events. `json` writes the calls
//! as a plain JSON array.
//!
//! Timestamps are microseconds (fractional, so nanoseconds survive) since
//! the trace's origin: the session start, or the earliest event if one is
//! older (a wait that began before tracing started).
//!
//! Both formats are written as they are produced: calls and waits are read
//! from the store one at a time on this thread, serialized in batches on
//! helper threads and written in order by one more (`pipeline`), never
//! gathered into one document. A whole
//! trace's calls are read by id and put in start order through a bounded
//! buffer where the file allows, from 2 CPUs on helper connections side by
//! side (`Rows::for_each_call_by_start_from`). Into a file, straight
//! through the buffer: the file is private until it is whole, so the rare
//! trace whose calls the buffer cannot place is written again with the
//! buffer's reach proved first (`write_file`); to a stdout that is a
//! regular file the same way, taken back to where the export began before
//! it is written again (`stdout_file`); to a pipe or a terminal, proved
//! first.
//! `json` reads nothing else.
//! A call's slice, most of a Perfetto document's elements, is written as
//! text by hand (`push_call_slice`, json_text.rs), byte for byte what
//! serde's derived form wrote.
//! `perfetto` still loads the whole trace once for the findings and the
//! memory tracks (`Analysis`), then lets it go before writing.

use crate::args::TraceInput;
use crate::load::{warn_input_problems, FORCE_HINT};
use crate::window::{Window, WindowArgs, WindowSource};
use serde::Serialize;
use serde_json::{json, Value};
use sleuth_core::analysis::Analysis;
use sleuth_core::findings::Finding;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::{CallEvent, Culprit, Layer, TraceData, WaitEvent};
use sleuth_store::stream::Rows;
use sleuth_store::{ByStart, ReadBudget, StoreError, Trace};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Chrome Trace Event JSON for ui.perfetto.dev and chrome://tracing.
    Perfetto,
    /// Perfetto's own protobuf trace (ui.perfetto.dev, trace_processor): what
    /// `perfetto` holds in fewer bytes. Binary: to a file
    /// (`-o trace.pftrace`) or a pipe, never a terminal.
    Pftrace,
    /// The calls as a plain JSON array (the `CallEvent` fields, `op` by name).
    Json,
}

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  gpusleuth export --db trace.db --format perfetto -o trace.json   (open in ui.perfetto.dev)\n  gpusleuth export --db trace.db --format pftrace -o trace.pftrace   (the same as Perfetto's protobuf: smaller, faster)\n  gpusleuth export --db trace.db --format json | jq length"
)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    /// Default: `pftrace` when `-o` ends in `.pftrace` or `.perfetto-trace`,
    /// else `perfetto`.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Output file (default: stdout). Written atomically; never the input trace. Faster than
    /// a pipe for a large trace (as is stdout redirected to a file): its calls are put in order
    /// without a first pass over them.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// `--from`/`--to`/`--last`: the calls that start in the window, the waits
    /// that overlap it, the memory tracks and GPU samples inside it (the
    /// findings stay the whole trace's).
    #[command(flatten)]
    pub window: WindowArgs,
}

impl Args {
    /// The format asked for, else the one the output's name says.
    fn format(&self) -> Format {
        let protobuf = |p: &PathBuf| {
            p.extension().is_some_and(|e| {
                e.eq_ignore_ascii_case("pftrace") || e.eq_ignore_ascii_case("perfetto-trace")
            })
        };
        match (self.format, &self.output) {
            (Some(f), _) => f,
            (None, Some(path)) if protobuf(path) => Format::Pftrace,
            (None, _) => Format::Perfetto,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.input.db.is_dir() && !args.window.is_set() {
        // A whole run: every file of its directory, as a window from its start.
        // A running tracer's `--keep` may delete a file the export is
        // reading (round 50: 7 exports of 25 failed "no such file"). Into a
        // file nothing was published yet: the run is read again.
        let mut attempts = 0;
        let run = loop {
            attempts += 1;
            let retry = args.output.is_some() && attempts < 3;
            let run = match sleuth_store::run_window::last_of_run(
                &args.input.db,
                u64::MAX,
                &crate::checks_memo::budget(),
                crate::checks_memo::memo(),
            ) {
                Ok(run) => run,
                Err(e) if run_window::names_a_lost_file(&e) && retry => continue,
                Err(e) => return Err(e.into()),
            };
            match run_window::export(&args, &run) {
                Ok(()) => break run,
                Err(_) if run_window::lost_a_file(&run) && retry => continue,
                Err(e) if run_window::lost_a_file(&run) => {
                    return Err(e.context(
                        "a file of the run was deleted (`--keep`) while the export read it: export again (with -o the export reads the run again by itself)",
                    ))
                }
                Err(e) => return Err(e),
            }
        };
        eprintln!(
            "gpusleuth: the run in {}: read from its {} file(s), {}",
            args.input.db.display(),
            run.files.len(),
            crate::window::files_named(&run)
        );
        let files: Vec<_> = run.files.iter().map(|(_, p)| p.clone()).collect();
        crate::load::note_finished_files(&files);
        return Ok(0);
    }
    // A window of a run's directory is read from the file that holds it,
    // or over the files it spans.
    let file = match args.window.is_set() {
        true => match args.window.source_of(&args.input.db, None)? {
            WindowSource::File(f) => Some(f),
            WindowSource::Run(run, note) => {
                run_window::export(&args, &run)?;
                eprintln!("{note}");
                return Ok(0);
            }
        },
        false => None,
    };
    let db = file.as_ref().map_or(&args.input.db, |f| &f.path);
    if let Some(path) = &args.output {
        // Before the work: a refused output is known at once.
        crate::output_file::check_output(path, &[db], args.force, Some(FORCE_HINT))?;
    }
    let trace = crate::checks_memo::open(db)?;
    crate::load::note_if_unfinished(&trace)?;
    warn_input_problems(&trace)?;
    let pid = args.input.pid;
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let window = args.window.resolve_in(&trace, file.as_ref())?;
    let rows = Rows::open(&trace)?;
    // A damaged file is refused before anything is written (as loading it would be).
    rows.check_totals()?;
    let format = args.format();
    let frame = match format {
        Format::Perfetto | Format::Pftrace => {
            Some(PerfettoFrame::of(&trace, pid, window.is_some())?)
        }
        Format::Json => None,
    };
    let write = |w: &mut (dyn Write + Send), how: ByStart| -> anyhow::Result<()> {
        match (&frame, format) {
            (Some(f), Format::Pftrace) => write_pftrace(w, f, &rows, pid, window, how),
            (Some(f), _) => write_perfetto(w, f, &rows, pid, window, how),
            (None, _) => write_calls_json(w, &rows, pid, window, trace.has_host_context(), how),
        }
    };
    match &args.output {
        Some(path) => write_file(path, db, args.force, write)?,
        None => write_stdout(format, write)?,
    }
    // Not into the output itself (`> f 2>&1`, `2>&1 | jq`): a consumer
    // of the JSON gets the calls alone.
    if format == Format::Json && (args.output.is_some() || !stdout_file::stderr_is_stdout()) {
        note_counted_calls(&trace, pid)?;
    }
    if let Some(f) = &file {
        f.say();
    }
    Ok(0)
}

/// `json` holds the calls the trace stored one by one; launches counted
/// in the kernel (`--launches driver`, the default) have no row: one note
/// on stderr says how many are not in it (round 51's tester: 70 launches
/// missing without a word).
fn note_counted_calls(trace: &sleuth_store::Trace, pid: Option<u32>) -> anyhow::Result<()> {
    let counted: u64 = trace.op_counts(pid)?.iter().map(|c| c.count).sum();
    if counted > 0 {
        eprintln!(
            "gpusleuth: note: {counted} call(s) of the trace were counted in the kernel, not recorded one by one (`--launches`): not in this export (`stats` counts them)"
        );
    }
    Ok(())
}

/// Writes through `write` into a private temporary file beside `path`,
/// then renames it into place: the output appears whole or not at all.
///
/// The calls are read straight through the reorder buffer first
/// (`ByStart::Speculate`): nobody sees the file before it is whole, so a
/// trace whose calls the buffer cannot place (a call stored after more
/// than the buffer holds started after it) costs a second writing, with
/// the buffer's reach proved first. The proof was a fifth to a quarter of
/// a whole export's time, paid by every trace (docs/benchmarks.md, round 45).
fn write_file(
    path: &Path,
    db: &Path,
    force: bool,
    write: impl Fn(&mut (dyn Write + Send), ByStart) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    crate::output_file::check_output(path, &[db], force, Some(FORCE_HINT))?;
    let tmp = sleuth_store::outfile::temp_path_for(path);
    let result = match write_temp(&tmp, path, &write, ByStart::Speculate) {
        Err(e) if out_of_reach(&e) => {
            let _ = std::fs::remove_file(&tmp);
            #[cfg(test)]
            test_seams::WRITTEN_AGAIN.with(|c| c.set(c.get() + 1));
            write_temp(&tmp, path, &write, ByStart::ProveFirst)
        }
        other => other,
    }
    .and_then(|()| {
        sleuth_store::outfile::publish(&tmp, path, force, Some(FORCE_HINT))?;
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `write` into a new private file at `tmp` (for `path`), synced.
fn write_temp(
    tmp: &Path,
    path: &Path,
    write: impl Fn(&mut (dyn Write + Send), ByStart) -> anyhow::Result<()>,
    how: ByStart,
) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
        .map_err(io)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, WriteBehind::new(f));
    write(&mut w, how)?;
    let f = w.into_inner().map_err(|e| e.into_error())?.into_inner();
    f.sync_all().map_err(io)?;
    Ok(())
}

/// Whether `e` is a read straight through the reorder buffer that met a
/// call it cannot place (the output is written again).
fn out_of_reach(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<StoreError>(),
        Some(StoreError::OutOfReach { .. })
    )
}

/// Writes through `write` to stdout, then a newline after JSON (none
/// after a protobuf: it would be read as a field). A closed pipe (`| head`)
/// ends the output quietly, as `load::emit` does. A binary format is
/// refused on a terminal, before anything is read. A stdout that is a
/// regular file is written as `-o` writes, straight through the reorder
/// buffer (`stdout_file`).
fn write_stdout(
    format: Format,
    write: impl Fn(&mut (dyn Write + Send), ByStart) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if format == Format::Pftrace && std::io::stdout().is_terminal() {
        anyhow::bail!(
            "--format pftrace is binary: write it to a file (-o trace.pftrace) or a pipe"
        );
    }
    let newline: &[u8] = match format {
        Format::Pftrace => b"",
        Format::Perfetto | Format::Json => b"\n",
    };
    let result = match stdout_file::regular_stdout() {
        Some((file, start)) => write_regular(&file, start, newline, &write),
        None => {
            // `Stdout`, not its lock: the export writes from a helper
            // thread (pipeline.rs), and the lock cannot leave this one.
            let mut w = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout());
            // What reached a pipe or a terminal cannot be taken back: the
            // buffer's reach is proved before the first call is written.
            write_whole(&mut w, newline, &write, ByStart::ProveFirst)
        }
    };
    match result {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                || e.downcast_ref::<serde_json::Error>()
                    .and_then(|j| j.io_error_kind())
                    == Some(std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        Err(e) => Err(e.context("writing to stdout")),
        Ok(()) => Ok(()),
    }
}

/// `write` read `how`, then `newline`, flushed.
fn write_whole(
    w: &mut (dyn Write + Send),
    newline: &[u8],
    write: &impl Fn(&mut (dyn Write + Send), ByStart) -> anyhow::Result<()>,
    how: ByStart,
) -> anyhow::Result<()> {
    write(w, how)?;
    w.write_all(newline)?;
    w.flush()?;
    Ok(())
}

/// Into `file` (stdout: a regular file that ended at `start`), the calls
/// straight through the reorder buffer; where it cannot place one, the
/// file is taken back to `start` and written again with the buffer's
/// reach proved first (`stdout_file::take_back`).
fn write_regular(
    file: &std::fs::File,
    start: u64,
    newline: &[u8],
    write: &impl Fn(&mut (dyn Write + Send), ByStart) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout_file::Counted::new(file));
    match write_whole(&mut w, newline, write, ByStart::Speculate) {
        Err(e) if out_of_reach(&e) => {
            // What the buffer still holds is dropped, not written.
            let (counted, _unwritten) = w.into_parts();
            stdout_file::take_back(file, start, counted.bytes)?;
            #[cfg(test)]
            test_seams::WRITTEN_AGAIN.with(|c| c.set(c.get() + 1));
            let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
            write_whole(&mut w, newline, write, ByStart::ProveFirst)
        }
        other => other,
    }
}

/// A JSON array written one element at a time (compact, as
/// `serde_json::to_vec` writes a whole array). Each element is serialized
/// into a buffer of the writer's own and handed to the output in pieces of
/// [`ArrayWriter::PIECE`] bytes: serializing straight into `dyn Write`
/// made a virtual call per token, a fifth of a large export's time.
struct ArrayWriter<'w> {
    w: &'w mut (dyn Write + Send),
    buf: Vec<u8>,
    first: bool,
}

impl<'w> ArrayWriter<'w> {
    const PIECE: usize = 1 << 16;

    /// The array from its `[`.
    fn open(w: &'w mut (dyn Write + Send)) -> std::io::Result<ArrayWriter<'w>> {
        w.write_all(b"[")?;
        Ok(Self::after_open(w))
    }

    /// The array's elements after a `[` already written.
    fn after_open(w: &'w mut (dyn Write + Send)) -> ArrayWriter<'w> {
        ArrayWriter {
            w,
            buf: Vec::with_capacity(Self::PIECE + 4096),
            first: true,
        }
    }

    /// Elements serialized elsewhere (`Elements`), after those written.
    fn append(&mut self, elements: &Elements) -> std::io::Result<()> {
        if elements.buf.is_empty() {
            return Ok(());
        }
        if !self.first {
            self.buf.push(b',');
        }
        self.first = false;
        self.buf.extend_from_slice(&elements.buf);
        self.flush_piece()
    }

    /// Hands the buffer to the output once it holds a piece.
    fn flush_piece(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= Self::PIECE {
            self.w.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes what is buffered, without closing the array.
    fn finish(self) -> std::io::Result<()> {
        self.w.write_all(&self.buf)
    }

    fn close(mut self) -> std::io::Result<()> {
        self.buf.push(b']');
        self.finish()
    }
}

/// Where the elements of a JSON array go: the array being written
/// ([`ArrayWriter`]), or a batch's elements serialized on a helper thread
/// ([`Elements`], pipeline.rs).
trait Items {
    /// The buffer the next element is written into, its separator already
    /// there.
    fn next_element(&mut self) -> &mut Vec<u8>;
    /// After an element was written into [`Items::next_element`]'s buffer.
    fn element_written(&mut self) -> anyhow::Result<()>;

    fn item<T: Serialize + ?Sized>(&mut self, v: &T) -> anyhow::Result<()> {
        serde_json::to_writer(self.next_element(), v)?;
        self.element_written()
    }

    /// An element whose JSON text `write` puts in the buffer whole
    /// (json_text.rs).
    fn raw(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> anyhow::Result<()> {
        write(self.next_element());
        self.element_written()
    }
}

impl Items for ArrayWriter<'_> {
    fn next_element(&mut self) -> &mut Vec<u8> {
        if !self.first {
            self.buf.push(b',');
        }
        self.first = false;
        &mut self.buf
    }

    fn element_written(&mut self) -> anyhow::Result<()> {
        Ok(self.flush_piece()?)
    }
}

/// Elements of a JSON array in memory, comma-separated (no brackets).
#[derive(Default)]
struct Elements {
    buf: Vec<u8>,
}

impl Items for Elements {
    fn next_element(&mut self) -> &mut Vec<u8> {
        // A JSON value is never empty: an empty buffer holds no element.
        if !self.buf.is_empty() {
            self.buf.push(b',');
        }
        &mut self.buf
    }

    fn element_written(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// One element of `--format json` as JSON text: the calls as every other
/// output names them — `op` and `layer` by name — and the
/// on-CPU/runnable/blocked split null when the trace has no host context
/// (imports), never 0. Keys in name order, absent values null: the
/// document `serde_json` wrote before it streamed
/// (`reference::calls_json`), byte for byte.
fn push_json_call(b: &mut Vec<u8>, c: &CallEvent, host: bool) {
    use json_text::{push_int, push_opt_u64, push_str};
    let host_ns = |ns: u64| host.then_some(ns);
    b.extend_from_slice(b"{\"blocked_ns\":");
    push_opt_u64(b, host_ns(c.blocked_ns));
    b.extend_from_slice(b",\"cpu\":");
    push_opt_u64(b, host_ns(c.cpu.into()));
    b.extend_from_slice(b",\"dur_ns\":");
    push_int(b, c.dur_ns);
    b.extend_from_slice(match c.failed() {
        true => b",\"failed\":true",
        false => b",\"failed\":false",
    });
    b.extend_from_slice(b",\"kind\":");
    push_opt_u64(b, c.kind);
    b.extend_from_slice(b",\"layer\":");
    match c.layer() {
        Some(layer) => push_str(b, layer.as_str()),
        None => b.extend_from_slice(b"null"),
    }
    b.extend_from_slice(match c.nested {
        true => b",\"nested\":true",
        false => b",\"nested\":false",
    });
    b.extend_from_slice(b",\"on_cpu_ns\":");
    push_opt_u64(b, host_ns(c.on_cpu_ns()));
    b.extend_from_slice(b",\"op\":");
    push_str(b, c.op_name());
    b.extend_from_slice(b",\"pid\":");
    push_int(b, c.pid);
    b.extend_from_slice(b",\"ptr\":");
    push_opt_u64(b, c.ptr);
    push_ret(b, c);
    b.extend_from_slice(b",\"runnable_ns\":");
    push_opt_u64(b, host_ns(c.runnable_ns));
    b.extend_from_slice(b",\"size\":");
    push_opt_u64(b, c.size);
    b.extend_from_slice(b",\"stream\":");
    push_opt_u64(b, c.stream);
    b.extend_from_slice(b",\"tid\":");
    push_int(b, c.tid);
    b.extend_from_slice(b",\"ts_ns\":");
    push_int(b, c.ts_ns);
    b.push(b'}');
}

/// A call's `,"ret":`: its status, or null for an op that returns none
/// (both hand-written elements: `push_json_call`, `push_call_slice`).
fn push_ret(b: &mut Vec<u8>, c: &CallEvent) {
    use json_text::push_int;
    b.extend_from_slice(b",\"ret\":");
    match c.has_status() {
        true => push_int(b, c.ret),
        false => b.extend_from_slice(b"null"),
    }
}

/// CPUs from which an export reads its calls on helper connections side
/// by side (`Rows::for_each_call_by_start_from`): two (six before round
/// 44 for the Perfetto JSON export, whose serializer then filled the
/// second CPU). Each export's serializer is light enough: on a small machine
/// the reading thread was the whole export's time and the other CPU idled.
/// The bench's 10M-call trace on the 2-vCPU development VM:
/// `--format pftrace` (packets cost the serializer about a third of what
/// JSON slices did) 15.8 -> 11.7 s, peak RSS 27 -> 78 MB (the calls the
/// helpers read ahead; round 37); `--format json` (a call's object cost its
/// serializer 3.4 of 15.8 s of CPU) 9.5-10.1 -> 8.0-8.5 s, 27 -> 103-111 MB
/// (round 41); Perfetto JSON, once a call's slice was written as text
/// (15.2 -> 13.1 s of CPU), 10.4-10.7 -> 9.5-9.6 s, 29 -> 89-97 MB
/// (round 44; before it, the helpers gained nothing there: 13.9 -> 13.7 s).
const EXPORT_SIDE_BY_SIDE_FROM_CPUS: usize = 2;

/// The calls array of `--format json`, from the store in load order.
fn write_calls_json(
    w: &mut (dyn Write + Send),
    rows: &Rows,
    pid: Option<u32>,
    window: Option<Window>,
    host: bool,
    how: ByStart,
) -> anyhow::Result<()> {
    let mut a = ArrayWriter::open(w)?;
    pipelined(
        &mut a,
        |sink| {
            rows.for_each_call_by_start_from::<anyhow::Error>(
                &Window::calls(window, pid),
                EXPORT_SIDE_BY_SIDE_FROM_CPUS,
                how,
                |c| sink.push(c.call),
            )
        },
        |c, el| el.raw(|b| push_json_call(b, c, host)),
    )?;
    a.close()?;
    Ok(())
}

/// Nanoseconds since `origin` as fractional microseconds.
fn us(ns: u64, origin: u64) -> f64 {
    ns.saturating_sub(origin) as f64 / 1e3
}

fn dur_us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// A complete slice (`ph: X`) of a wait's off-CPU time; a call's is
/// written as text ([`push_call_slice`]).
#[derive(Serialize)]
struct OffCpuSlice<'a> {
    args: OffCpuArgs<'a>,
    cat: &'static str,
    dur: f64,
    name: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u32,
    ts: f64,
}

/// A call's complete slice (`ph: X`) as JSON text, keys in name order as
/// every element's (`serde_json`'s maps sort them, and the export was one
/// such document before it streamed: `reference::call_slice`); the
/// arguments `kind`, `nested`, `ptr`, `site`, `size`, `stack` and `stream`
/// left out when absent, as they always were; the on-CPU, runnable and
/// blocked times null without host context (imports), never 0.
fn push_call_slice(b: &mut Vec<u8>, c: &CallEvent, ctx: &TraceData, origin: u64) {
    use json_text::{push_hex, push_int, push_micros, push_opt_u64, push_str};
    let host = ctx.has_host_context;
    let host_micros = |b: &mut Vec<u8>, ns: u64| match host {
        true => push_micros(b, ns),
        false => b.extend_from_slice(b"null"),
    };
    // The call site and its stack (innermost first) on the slice.
    let stack = c.stack_id.and_then(|id| ctx.stacks.get(&id));
    b.extend_from_slice(b"{\"args\":{\"blocked_us\":");
    host_micros(b, c.blocked_ns);
    b.extend_from_slice(b",\"cpu\":");
    push_opt_u64(b, host.then_some(c.cpu.into()));
    if let Some(kind) = c.kind {
        b.extend_from_slice(b",\"kind\":");
        push_int(b, kind);
    }
    b.extend_from_slice(b",\"layer\":");
    push_str(b, c.layer().map(Layer::as_str).unwrap_or("unknown"));
    if c.nested {
        b.extend_from_slice(b",\"nested\":true");
    }
    b.extend_from_slice(b",\"on_cpu_us\":");
    host_micros(b, c.on_cpu_ns());
    b.extend_from_slice(b",\"op\":");
    push_str(b, c.op_name());
    if let Some(ptr) = c.ptr {
        b.extend_from_slice(b",\"ptr\":");
        push_hex(b, ptr);
    }
    push_ret(b, c);
    b.extend_from_slice(b",\"runnable_us\":");
    host_micros(b, c.runnable_ns);
    if let Some(st) = stack {
        b.extend_from_slice(b",\"site\":");
        push_str(b, &st.site_label());
    }
    if let Some(size) = c.size {
        b.extend_from_slice(b",\"size\":");
        push_int(b, size);
    }
    if let Some(st) = stack {
        b.extend_from_slice(b",\"stack\":[");
        for (i, frame) in st.frames.iter().enumerate() {
            if i > 0 {
                b.push(b',');
            }
            push_str(b, &frame.label());
        }
        b.push(b']');
    }
    if let Some(stream) = c.stream {
        b.extend_from_slice(b",\"stream\":");
        push_hex(b, stream);
    }
    b.extend_from_slice(b"},\"cat\":");
    push_str(b, category(c.layer()));
    b.extend_from_slice(b",\"dur\":");
    push_micros(b, c.dur_ns);
    b.extend_from_slice(b",\"name\":");
    push_str(b, c.op_name());
    b.extend_from_slice(b",\"ph\":\"X\",\"pid\":");
    push_int(b, c.pid);
    b.extend_from_slice(b",\"tid\":");
    push_int(b, c.tid);
    b.extend_from_slice(b",\"ts\":");
    push_micros(b, c.ts_ns.saturating_sub(origin));
    b.push(b'}');
}

/// A call slice's category, `cuda.<layer>`.
fn category(layer: Option<Layer>) -> &'static str {
    match layer {
        Some(Layer::Runtime) => "cuda.runtime",
        Some(Layer::Driver) => "cuda.driver",
        Some(Layer::Torch) => "cuda.torch",
        Some(Layer::Nccl) => "cuda.nccl",
        None => "cuda.unknown",
    }
}

/// Everything of a Perfetto document that is not a call or a wait: the
/// trace without its calls and waits (processes, stacks, NVML samples,
/// session times), the threads that appear, the origin, the memory tracks
/// and the findings.
struct PerfettoFrame {
    ctx: TraceData,
    threads: BTreeSet<(u32, u32)>,
    origin: u64,
    ledgers: Vec<ProcessLedger>,
    findings: Vec<Finding>,
}

impl PerfettoFrame {
    /// The findings and memory tracks are `Analysis`'s (the same as
    /// `explain` and the report show); it needs the whole trace loaded,
    /// which is let go before any call is written (the findings do not
    /// stream yet: this load is what bounds `export`'s memory now).
    /// `windowed`: the threads named up front are those with calls; the
    /// waits' own are named as the window's waits are written.
    fn of(trace: &Trace, pid: Option<u32>, windowed: bool) -> anyhow::Result<PerfettoFrame> {
        if let Some(f) = Self::lean(trace, pid, windowed)? {
            return Ok(f);
        }
        let mut data = trace.load(pid)?;
        let analysis = Analysis::of(&data);
        let mut threads: BTreeSet<(u32, u32)> = BTreeSet::new();
        threads.extend(data.calls.iter().map(|c| (c.pid, c.tid)));
        threads.extend(data.waits.iter().map(|w| (w.pid, w.tid)));
        data.calls = Vec::new();
        data.waits = Vec::new();
        Ok(PerfettoFrame {
            ctx: data,
            threads,
            origin: analysis.span.origin_ns,
            ledgers: analysis.ledgers,
            findings: analysis.explanation.findings,
        })
    }

    /// The frame from the lean load (`sleuth_store::lean`: the stored
    /// finding aggregates, the call groups and the streamed ledgers) when
    /// the trace has them: memory bounded by the aggregates, not the calls.
    /// The threads are those of the call groups and of the waits, the
    /// origin `TraceSpan::of`'s (session start, first call, first wait or
    /// lifecycle event), both as the full load gives them.
    fn lean(
        trace: &Trace,
        pid: Option<u32>,
        windowed: bool,
    ) -> anyhow::Result<Option<PerfettoFrame>> {
        let budget = ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
        let Some(lean) = sleuth_store::lean::load(trace, pid, budget)? else {
            return Ok(None);
        };
        let explanation = lean.explanation();
        let view = &lean.view;
        // The view's call groups are of every process; `--pid` keeps its own.
        let groups = view.own_groups();
        let mut threads: BTreeSet<(u32, u32)> = groups.clone().map(|g| (g.pid, g.tid)).collect();
        if !windowed {
            // Every wait's thread: a pass over the waits.
            threads.extend(view.rows().wait_threads(pid)?);
        }
        let first_call = groups.map(|g| g.first_ts_ns).min();
        let earliest = first_call
            .into_iter()
            .chain(view.rows().earliest_wait_or_event(pid)?)
            .min();
        let start = view.span.start_ns;
        let origin = match lean.data.start_ns {
            Some(_) => earliest.map_or(start, |e| e.min(start)),
            None => earliest.unwrap_or(start),
        };
        let mut ctx = lean.data;
        ctx.calls = Vec::new();
        Ok(Some(PerfettoFrame {
            ctx,
            threads,
            origin,
            ledgers: lean.ledgers,
            findings: explanation.findings,
        }))
    }

    /// The document around `traceEvents` ([`halves_at`]).
    fn halves(&self) -> anyhow::Result<(String, String)> {
        halves_at(self.origin, self.ctx.realtime_offset_ns)
    }
}

/// The document around `traceEvents` (the last key in name order), so
/// events can be written between its two halves; times count from
/// `origin` (monotonic ns), `realtime_offset_ns` gives its wall-clock time.
fn halves_at(origin: u64, realtime_offset_ns: i64) -> anyhow::Result<(String, String)> {
    let doc = json!({
        "traceEvents": [],
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": "gpusleuth",
            "version": env!("CARGO_PKG_VERSION"),
            "origin_mono_ns": origin,
            "origin_unix_ns": origin as i128 + realtime_offset_ns as i128,
        },
    });
    let text = serde_json::to_string(&doc)?;
    match text.strip_suffix("[]}") {
        Some(head) if head.ends_with("\"traceEvents\":") => {
            Ok((format!("{head}["), "]}".to_string()))
        }
        _ => anyhow::bail!("internal error: traceEvents is not the document's last key"),
    }
}

/// The whole trace as a Chrome Trace Event document, written as produced.
fn write_perfetto(
    w: &mut (dyn Write + Send),
    f: &PerfettoFrame,
    rows: &Rows,
    pid: Option<u32>,
    window: Option<Window>,
    how: ByStart,
) -> anyhow::Result<()> {
    // Every timestamp is relative to the extent's origin: a wait begun
    // before tracing started is drawn at its place, never at a negative time.
    let origin = f.origin;
    let data = &f.ctx;
    let (head, tail) = f.halves()?;
    w.write_all(head.as_bytes())?;
    let mut ev = ArrayWriter::after_open(&mut *w);
    metadata(data, &f.threads, &mut ev)?;
    // The threads of the window's waits not named yet (the frame named
    // those with calls), named after their slices.
    let mut unnamed = BTreeSet::new();
    pipelined(
        &mut ev,
        |sink| {
            rows.for_each_call_by_start_from::<anyhow::Error>(
                &Window::calls(window, pid),
                EXPORT_SIDE_BY_SIDE_FROM_CPUS,
                how,
                |c| sink.push(Record::Call(c.call)),
            )?;
            let mut wait = |wt: WaitEvent| sink.push(Record::Wait(wt));
            match window {
                Some(win) => {
                    rows.for_each_wait_in::<anyhow::Error>(pid, win.since, win.until, |wt| {
                        if !f.threads.contains(&(wt.pid, wt.tid)) {
                            unnamed.insert((wt.pid, wt.tid));
                        }
                        wait(wt)
                    })
                }
                None => rows.for_each_wait::<anyhow::Error>(pid, wait),
            }
        },
        |record, el| record.write(el, data, origin),
    )?;
    if window.is_some() {
        // The processes `metadata` named: the trace's and the frame threads'.
        let named: BTreeSet<u32> = data
            .processes
            .iter()
            .map(|p| p.pid)
            .chain(f.threads.iter().map(|t| t.0))
            .collect();
        let new_pids = unnamed.iter().map(|t| t.0).filter(|p| !named.contains(p));
        process_names(data, &new_pids.collect(), &mut ev)?;
        thread_names(data, &unnamed, &mut ev)?;
    }
    memory_tracks(&f.ledgers, origin, window, &mut ev)?;
    gpu_counters(data, origin, window, &mut ev)?;
    for finding in &f.findings {
        ev.item(&finding_event(finding, data, origin))?;
    }
    ev.finish()?;
    w.write_all(tail.as_bytes())?;
    Ok(())
}

/// The whole trace (or its window) as Perfetto's protobuf (pftrace.rs):
/// the same frame as [`write_perfetto`]'s, the calls in start order, then
/// the waits.
fn write_pftrace(
    w: &mut (dyn Write + Send),
    f: &PerfettoFrame,
    rows: &Rows,
    pid: Option<u32>,
    window: Option<Window>,
    how: ByStart,
) -> anyhow::Result<()> {
    let frame = pftrace::Frame {
        ctx: &f.ctx,
        origin: f.origin,
        ledgers: &f.ledgers,
        findings: &f.findings,
    };
    pftrace::write(w, frame, window, |tracks, sink| {
        let q = Window::calls(window, pid);
        rows.for_each_call_by_start_from::<anyhow::Error>(
            &q,
            EXPORT_SIDE_BY_SIDE_FROM_CPUS,
            how,
            |c| tracks.call(sink, c.call),
        )?;
        match window {
            Some(win) => rows.for_each_wait_in::<anyhow::Error>(pid, win.since, win.until, |wt| {
                tracks.wait(sink, wt)
            }),
            // Whole: in row order, no sort (trace_processor orders events).
            None => rows.for_each_wait_by_id::<anyhow::Error>(pid, |wt| tracks.wait(sink, wt)),
        }
    })
}

/// A row of the trace on its way from the reader to the writer (pipeline.rs).
enum Record {
    Call(CallEvent),
    Wait(WaitEvent),
    /// A thread's name (and its process's, with `process`) before its
    /// first slice, where the names are given as threads appear.
    Name {
        pid: u32,
        tid: u32,
        process: bool,
    },
}

impl Record {
    /// The (pid, tid) whose track the record is drawn on.
    fn thread(&self) -> (u32, u32) {
        match self {
            Record::Call(c) => (c.pid, c.tid),
            Record::Wait(w) => (w.pid, w.tid),
            Record::Name { pid, tid, .. } => (*pid, *tid),
        }
    }

    /// The record as its slices: a call's, a wait's off-CPU ones.
    fn write(&self, ev: &mut impl Items, ctx: &TraceData, origin: u64) -> anyhow::Result<()> {
        match self {
            Record::Call(c) => ev.raw(|b| push_call_slice(b, c, ctx, origin)),
            Record::Wait(w) => off_cpu_slices(w, origin).try_for_each(|s| ev.item(&s)),
            &Record::Name { pid, tid, process } => {
                if process {
                    process_names(ctx, &BTreeSet::from([pid]), ev)?;
                }
                thread_names(ctx, &BTreeSet::from([(pid, tid)]), ev)
            }
        }
    }
}

/// Device memory per process as counter tracks (live bytes after each
/// change of the ledgers' timelines in the window) and each failed
/// allocation in it as an instant event.
fn memory_tracks(
    ledgers: &[ProcessLedger],
    origin: u64,
    window: Option<Window>,
    ev: &mut ArrayWriter,
) -> anyhow::Result<()> {
    let name = "device memory (bytes)";
    for (l, start) in drawn_ledgers(ledgers, origin, window) {
        ev.item(
            &json!({"ph": "C", "name": name, "pid": l.pid, "ts": us(start.at, origin),
                        "args": {"live_bytes": start.live_bytes}}),
        )?;
        for p in l.timeline.iter().filter(|p| start.holds(p.ts_ns)) {
            ev.item(
                &json!({"ph": "C", "name": name, "pid": l.pid, "ts": us(p.ts_ns, origin),
                        "args": {"live_bytes": p.live_bytes}}),
            )?;
        }
        if let Some(exit) = start.exit_in(l) {
            ev.item(
                &json!({"ph": "C", "name": name, "pid": l.pid, "ts": us(exit, origin),
                        "args": {"live_bytes": 0}}),
            )?;
        }
        for fa in l.failed_allocs.iter().filter(|fa| start.holds(fa.ts_ns)) {
            ev.item(&json!({"ph": "i", "s": "p", "name": format!("failed {}", fa.op),
                            "cat": "memory", "pid": l.pid, "tid": l.pid, "ts": us(fa.ts_ns, origin),
                            "args": {"bytes": fa.bytes, "error": fa.error, "live_bytes_at": fa.live_bytes_at}}))?;
        }
    }
    Ok(())
}

/// Where a process's memory track begins and what it draws after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TrackStart {
    /// The first sample's time (monotonic ns): the origin, or the window's
    /// start when later.
    at: u64,
    /// What was live then: the last timeline point before it.
    live_bytes: u64,
    /// The window's end (exclusive).
    until: u64,
}

impl TrackStart {
    /// Whether a point at `ts_ns` is drawn after the first sample: a run's
    /// ledger holds points from before the document's origin (files
    /// `--keep` deleted), which would all be drawn at 0.
    fn holds(&self, ts_ns: u64) -> bool {
        (self.at..self.until).contains(&ts_ns)
    }

    /// The process's exit when drawn: its track falls to 0 there (the
    /// driver frees a process's memory at its exit; round 55: a track
    /// stayed at what was live at the exit to the end of the document).
    fn exit_in(&self, l: &ProcessLedger) -> Option<u64> {
        l.exit_ns.filter(|&e| self.holds(e))
    }
}

/// Where a process's memory track begins: at the origin, or the window's
/// start when later, with what was live then (not at the first
/// allocation, and never a point from before it drawn at 0). None for a
/// process that exited before then: the driver frees a process's memory at
/// its exit, so it holds nothing there. Both Perfetto formats draw it so.
fn memory_track_start(
    l: &ProcessLedger,
    origin: u64,
    window: Option<Window>,
) -> Option<TrackStart> {
    let at = window.map_or(origin, |w| w.since.max(origin));
    if l.exit_ns.is_some_and(|e| e < at) {
        return None;
    }
    let live_bytes = l
        .timeline
        .iter()
        .take_while(|p| p.ts_ns < at)
        .last()
        .map_or(0, |p| p.live_bytes);
    let until = window.map_or(u64::MAX, |w| w.until);
    Some(TrackStart {
        at,
        live_bytes,
        until,
    })
}

/// The ledgers whose memory track is drawn, each with its start.
fn drawn_ledgers(
    ledgers: &[ProcessLedger],
    origin: u64,
    window: Option<Window>,
) -> impl Iterator<Item = (&ProcessLedger, TrackStart)> {
    ledgers
        .iter()
        .filter_map(move |l| memory_track_start(l, origin, window).map(|s| (l, s)))
}

/// When a GPU busy sample is drawn (monotonic ns): a step at the start of
/// its period, never before the origin.
fn busy_step_at(g: &sleuth_core::GpuSample, origin: u64) -> u64 {
    g.ts_ns.saturating_sub(g.period_ns).max(origin)
}

/// Pseudo-process holding the GPU busy tracks (no real pid is 0 in a trace).
const GPU_TRACK_PID: u32 = 0;

/// NVML figures as counter tracks: GPU busy per GPU (a step at the start
/// of each sample period) on a "GPUs (NVML)" track, and per process the
/// device memory the driver attributed to it (pre-trace memory included).
fn gpu_counters(
    data: &TraceData,
    origin: u64,
    window: Option<Window>,
    ev: &mut ArrayWriter,
) -> anyhow::Result<()> {
    let held = |ts: u64| Window::covers(window, ts);
    if let Some(samples) = &data.gpu_samples {
        ev.item(
            &json!({"ph": "M", "name": "process_name", "pid": GPU_TRACK_PID, "tid": 0,
                       "args": {"name": "GPUs (NVML)"}}),
        )?;
        for g in samples.iter().filter(|g| held(g.ts_ns)) {
            let at = busy_step_at(g, origin);
            ev.item(
                &json!({"ph": "C", "name": format!("GPU {} busy (%)", g.gpu),
                           "pid": GPU_TRACK_PID, "ts": us(at, origin),
                           "args": {"busy_pct": g.busy_pct}}),
            )?;
        }
    }
    for p in data.process_gpu.iter().filter(|p| held(p.ts_ns)) {
        if let Some(b) = p.used_bytes {
            ev.item(
                &json!({"ph": "C", "name": format!("GPU {} memory held, NVML (bytes)", p.gpu),
                           "pid": p.pid, "ts": us(p.ts_ns, origin),
                           "args": {"used_bytes": b}}),
            )?;
        }
    }
    Ok(())
}

/// `process_name` / `thread_name` records: every process and thread that appears.
fn metadata(
    data: &TraceData,
    threads: &BTreeSet<(u32, u32)>,
    ev: &mut ArrayWriter,
) -> anyhow::Result<()> {
    let mut pids: BTreeSet<u32> = data.processes.iter().map(|p| p.pid).collect();
    pids.extend(threads.iter().map(|t| t.0));
    process_names(data, &pids, ev)?;
    thread_names(data, threads, ev)
}

/// `process_name` records of `pids`.
fn process_names(
    data: &TraceData,
    pids: &BTreeSet<u32>,
    ev: &mut impl Items,
) -> anyhow::Result<()> {
    for &pid in pids {
        ev.item(
            &json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": process_label(data, pid)}}),
        )?;
    }
    Ok(())
}

/// A process's name on its track: `comm (pid)`.
fn process_label(data: &TraceData, pid: u32) -> String {
    format!("{} ({pid})", data.comm_of(pid))
}

/// A thread's name on its track: `comm (main tid)` or `thread tid`.
fn thread_label(data: &TraceData, pid: u32, tid: u32) -> String {
    match pid == tid {
        true => format!("{} (main {tid})", data.comm_of(pid)),
        false => format!("thread {tid}"),
    }
}

/// `thread_name` records of `threads`.
fn thread_names(
    data: &TraceData,
    threads: &BTreeSet<(u32, u32)>,
    ev: &mut impl Items,
) -> anyhow::Result<()> {
    for &(pid, tid) in threads {
        let name = thread_label(data, pid, tid);
        ev.item(
            &json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}}),
        )?;
    }
    Ok(())
}

/// A wait as up to two adjacent slices on its thread: blocked `[off, wake)`
/// and runnable `[wake, on)` (the latter names the tasks that held the CPU).
/// Typed records (keys in name order, as `json!` objects write them): a
/// large export writes one or two per wait. The test reference
/// (reference.rs) builds the same slices as `json!` documents.
fn off_cpu_slices(w: &WaitEvent, origin: u64) -> impl Iterator<Item = OffCpuSlice<'_>> {
    let slice = |name, cat, ts, dur, args| OffCpuSlice {
        args,
        cat,
        dur: dur_us(dur),
        name,
        ph: "X",
        pid: w.pid,
        tid: w.tid,
        ts: us(ts, origin),
    };
    let blocked = (w.blocked_ns() > 0).then(|| {
        slice(
            "off-cpu: blocked",
            "sched.blocked",
            w.off_ns,
            w.blocked_ns(),
            OffCpuArgs::Blocked {
                kind: w.kind.as_str(),
                prev_state: w.prev_state,
            },
        )
    });
    let runnable = (w.runnable_ns() > 0).then(|| {
        slice(
            "off-cpu: runnable",
            "sched.runnable",
            w.wake_ns.max(w.off_ns),
            w.runnable_ns(),
            OffCpuArgs::Runnable {
                cpu: w.cpu,
                culprits: CulpritList(&w.culprits),
                kind: w.kind.as_str(),
                preemptors: Preemptors(&w.culprits),
            },
        )
    });
    blocked.into_iter().chain(runnable)
}

#[derive(Serialize)]
#[serde(untagged)]
enum OffCpuArgs<'a> {
    Blocked {
        kind: &'static str,
        prev_state: u32,
    },
    Runnable {
        cpu: u32,
        culprits: CulpritList<'a>,
        kind: &'static str,
        preemptors: Preemptors<'a>,
    },
}

/// A runnable wait's culprits as `{comm, pid, tid, us}` objects.
struct CulpritList<'a>(&'a [Culprit]);

impl Serialize for CulpritList<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Entry<'a> {
            comm: &'a str,
            pid: u32,
            tid: u32,
            us: f64,
        }
        s.collect_seq(self.0.iter().map(|c| Entry {
            comm: &c.comm,
            pid: c.pid,
            tid: c.tid,
            us: dur_us(c.ns),
        }))
    }
}

/// A runnable wait's culprits as one string, "comm (pid), comm (pid)".
struct Preemptors<'a>(&'a [Culprit]);

impl std::fmt::Display for Preemptors<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} ({})", c.comm, c.pid)?;
        }
        Ok(())
    }
}

impl Serialize for Preemptors<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A finding as a global instant event at its first example call, else at
/// the earliest moment its evidence names (any `*ts_ns` field), else at the
/// session start.
fn finding_event(f: &Finding, data: &TraceData, origin: u64) -> Value {
    let ts = finding_time(f, data, origin);
    json!({
        "ph": "i", "s": "g", "cat": "finding",
        "name": finding_name(f),
        "ts": us(ts, origin), "pid": f.pids.first().copied().unwrap_or(0), "tid": 0,
        "args": {
            "severity": f.severity.as_str(),
            "summary": f.summary,
            "recommendation": f.recommendation,
            "pids": f.pids,
            "culprits": f.culprits,
            "evidence": f.evidence,
        },
    })
}

/// "kind: op", or the kind alone for a finding about no one op (a thread's
/// verdict).
fn finding_name(f: &Finding) -> String {
    match f.op.is_empty() {
        true => f.kind.as_str().to_string(),
        false => format!("{}: {}", f.kind.as_str(), f.op),
    }
}

/// Where a finding is drawn (monotonic ns): see [`finding_event`].
fn finding_time(f: &Finding, data: &TraceData, origin: u64) -> u64 {
    earliest_ts(&f.evidence["examples"])
        .or_else(|| earliest_ts(&f.evidence))
        .or(data.start_ns)
        .unwrap_or(origin)
}

fn earliest_ts(v: &Value) -> Option<u64> {
    match v {
        Value::Object(m) => m
            .iter()
            .filter_map(|(k, v)| {
                if k.ends_with("ts_ns") {
                    v.as_u64()
                } else {
                    earliest_ts(v)
                }
            })
            .min(),
        Value::Array(a) => a.iter().filter_map(earliest_ts).min(),
        _ => None,
    }
}

mod json_text;
mod pftrace;
mod pipeline;
mod proto;
mod run_window;
mod stdout_file;
mod write_behind;

use pipeline::{pipelined, Batches, Sink};
use write_behind::WriteBehind;

#[cfg(test)]
mod reference;

#[cfg(test)]
pub(super) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Files written again, their reorder buffer out of reach.
        pub(crate) static WRITTEN_AGAIN: Cell<usize> = const { Cell::new(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::sites::{Frame, FrameKind, Stack};
    use sleuth_core::{
        CallEvent, Culprit, Event, GpuSample, ProcessGpuSample, ProcessInfo, SamplePhase, WaitKind,
    };
    use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name)
    }

    /// What `export` writes for `db` (before the final newline).
    fn streamed(db: &Path, pid: Option<u32>, format: Format) -> Vec<u8> {
        let trace = Trace::open(db).unwrap();
        let rows = Rows::open(&trace).unwrap();
        let mut out = Vec::new();
        match format {
            Format::Perfetto => {
                let frame = PerfettoFrame::of(&trace, pid, false).unwrap();
                write_perfetto(&mut out, &frame, &rows, pid, None, ByStart::ProveFirst).unwrap();
            }
            Format::Json => write_calls_json(
                &mut out,
                &rows,
                pid,
                None,
                trace.has_host_context(),
                ByStart::ProveFirst,
            )
            .unwrap(),
            Format::Pftrace => panic!("the JSON formats are compared here"),
        }
        out
    }

    /// What `export` wrote before it streamed: the whole document built, then serialized.
    fn built(db: &Path, pid: Option<u32>, format: Format) -> Vec<u8> {
        let data = Trace::open(db).unwrap().load(pid).unwrap();
        let doc = match format {
            Format::Perfetto => reference::perfetto(&data, &Analysis::of(&data)),
            Format::Json => reference::calls_json(&data),
            Format::Pftrace => panic!("the JSON formats are compared here"),
        };
        serde_json::to_vec(&doc).unwrap()
    }

    /// The Perfetto document `export` writes for `db`, `pid` and `window`.
    pub(super) fn perfetto_doc(db: &Path, pid: Option<u32>, window: Option<Window>) -> Value {
        let trace = Trace::open(db).unwrap();
        let rows = Rows::open(&trace).unwrap();
        let frame = PerfettoFrame::of(&trace, pid, window.is_some()).unwrap();
        let mut out = Vec::new();
        write_perfetto(&mut out, &frame, &rows, pid, window, ByStart::ProveFirst).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    /// The middle third of `db`'s calls as a window: its export holds the
    /// calls starting in it and the waits overlapping it, each as the whole
    /// export draws it, the memory points inside it (after one at its start
    /// with what was live then), and names every thread it draws.
    pub(super) fn assert_window(db: &Path) {
        let trace = Trace::open(db).unwrap();
        let data = trace.load(None).unwrap();
        // The middle third of the calls' extent (a rewritten trace's
        // session may start at 0, long before its calls).
        let start = data.calls.iter().map(|c| c.ts_ns).min().unwrap();
        let d = data.calls.iter().map(|c| c.ts_ns + c.dur_ns).max().unwrap() - start;
        let w = Window {
            since: start + d / 3,
            until: start + 2 * d / 3,
            from_ns: 0,
            to_ns: None,
            last_ns: None,
            from_kept: false,
        };
        let whole = perfetto_doc(db, None, None);
        let win = perfetto_doc(db, None, Some(w));
        let origin = whole["otherData"]["origin_mono_ns"].as_u64().unwrap();
        assert_eq!(win["otherData"], whole["otherData"], "{db:?}");
        let events = |doc: &Value, cat: &str| -> Vec<String> {
            let mut v: Vec<String> = doc["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["cat"].as_str().is_some_and(|c| c.starts_with(cat)))
                .map(|e| e.to_string())
                .collect();
            v.sort();
            v
        };
        let (lo, hi) = (us(w.since, origin), us(w.until, origin));
        let in_window = |e: &String| {
            let ts = serde_json::from_str::<Value>(e).unwrap()["ts"]
                .as_f64()
                .unwrap();
            (lo..hi).contains(&ts)
        };
        let calls: Vec<String> = events(&whole, "cuda.")
            .into_iter()
            .filter(in_window)
            .collect();
        assert!(!calls.is_empty(), "{db:?}: no call in the window");
        assert!(
            calls.len() < events(&whole, "cuda.").len(),
            "{db:?}: every call in the window"
        );
        assert_eq!(events(&win, "cuda."), calls, "{db:?}");
        let mut waits: Vec<String> = data
            .waits
            .iter()
            .filter(|x| x.off_ns < w.until && x.on_ns >= w.since)
            .flat_map(|x| reference::off_cpu_slices(x, origin))
            .map(|e| e.to_string())
            .collect();
        waits.sort();
        assert!(!waits.is_empty(), "{db:?}: no wait in the window");
        assert_eq!(events(&win, "sched."), waits, "{db:?}");
        // Memory: one point at the window's start, then the whole track's points inside it.
        let counters = |doc: &Value| -> Vec<(u64, f64, u64)> {
            doc["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == "C" && e["name"] == "device memory (bytes)")
                .map(|e| {
                    let bytes = e["args"]["live_bytes"].as_u64().unwrap();
                    (e["pid"].as_u64().unwrap(), e["ts"].as_f64().unwrap(), bytes)
                })
                .collect()
        };
        for pid in counters(&whole)
            .iter()
            .map(|c| c.0)
            .collect::<BTreeSet<_>>()
        {
            let track = |doc: &Value| -> Vec<(f64, u64)> {
                counters(doc)
                    .into_iter()
                    .filter(|c| c.0 == pid)
                    .map(|c| (c.1, c.2))
                    .collect()
            };
            let (all, got) = (track(&whole), track(&win));
            let before = all
                .iter()
                .take_while(|p| p.0 < lo)
                .last()
                .map_or(0, |p| p.1);
            let mut want = vec![(lo, before)];
            want.extend(
                all.iter()
                    .copied()
                    .filter(|p| (lo..hi).contains(&p.0))
                    .skip(
                        // The whole track's first point (0 at ts 0) is no point of the ledger.
                        usize::from(lo == 0.0),
                    ),
            );
            assert_eq!(got, want, "{db:?} pid {pid}");
        }
        // Every thread drawn is named.
        let named: BTreeSet<(u64, u64)> = win["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .collect();
        for e in win["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
        {
            let t = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            assert!(named.contains(&t), "{db:?}: thread {t:?} drawn, not named");
        }
    }

    #[test]
    fn a_window_holds_what_the_whole_export_holds_in_it_on_the_examples() {
        for name in ["demo-sim.db", "h200-contention.db"] {
            assert_window(&example(name));
        }
    }

    fn assert_identical(db: &Path, pid: Option<u32>) {
        for format in [Format::Perfetto, Format::Json] {
            let (got, want) = (streamed(db, pid, format), built(db, pid, format));
            assert!(
                got == want,
                "{db:?} pid {pid:?}: streamed output differs from the built one\n{}\n---\n{}",
                String::from_utf8_lossy(&got[..got.len().min(3000)]),
                String::from_utf8_lossy(&want[..want.len().min(3000)])
            );
        }
    }

    #[test]
    fn streamed_export_is_byte_identical_on_the_examples() {
        // The machine's serializers, and three (h200-contention.db's 7,117
        // calls and waits are seven batches).
        for serializers in [None, Some(3)] {
            pipeline::test_seams::SERIALIZERS.with(|c| c.set(serializers));
            for name in ["demo-sim.db", "h200-contention.db"] {
                let db = example(name);
                assert_identical(&db, None);
                for pid in Trace::open(&db).unwrap().pids().unwrap() {
                    assert_identical(&db, Some(pid));
                }
            }
        }
        pipeline::test_seams::SERIALIZERS.with(|c| c.set(None));
    }

    fn call(ts: u64, dur: u64, op: &str, size: Option<u64>, ptr: Option<u64>) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 10,
            tid: 11,
            op: sleuth_core::op_by_name(op).unwrap().id,
            size,
            ptr,
            cpu: 1,
            ..Default::default()
        }
    }

    /// A writer of a new trace at `db` (replacing one left there).
    fn writer(db: &Path, session: SessionInfo) -> TraceWriter {
        let opts = WriterOptions {
            overwrite: true,
            ..Default::default()
        };
        TraceWriter::create(db, session, opts).unwrap()
    }

    /// A stored trace with what every part of the export shows: calls with
    /// sites, a nested and a failed call, a preemption with its culprit,
    /// NVML samples, and a memory track.
    fn simulated(db: &Path) {
        let w = writer(
            db,
            SessionInfo {
                start_mono_ns: 1_000_000,
                realtime_offset_ns: 1_700_000_000_000_000_000,
                hostname: "h".into(),
                ..Default::default()
            },
        );
        let h = w.handle();
        h.set_process(ProcessInfo {
            pid: 10,
            comm: "train".into(),
            ..Default::default()
        })
        .unwrap();
        h.add_stack(Stack {
            id: 5,
            pid: 10,
            frames: vec![Frame {
                kind: Some(FrameKind::Python),
                function: Some("step".into()),
                file: Some("/w/t.py".into()),
                line: Some(3),
                ..Default::default()
            }],
            notes: vec![],
        })
        .unwrap();
        h.add_gpu_samples(vec![GpuSample {
            ts_ns: 3_000_000,
            gpu: 0,
            busy_pct: 40.0,
            period_ns: 1_000_000,
        }])
        .unwrap();
        h.add_process_gpu_samples(vec![ProcessGpuSample {
            ts_ns: 1_000_000,
            gpu: 0,
            pid: 10,
            used_bytes: Some(1 << 30),
            sm_pct: None,
            phase: SamplePhase::Start,
        }])
        .unwrap();
        h.set_stat(sleuth_core::held::PROCESS_POLLS_STAT, 1)
            .unwrap();
        let mut malloc = call(1_002_000, 500, "cudaMalloc", Some(4096), Some(0x7f00));
        malloc.stack_id = Some(5);
        malloc.stream = Some(0xabc);
        malloc.kind = Some(1);
        let nested = CallEvent {
            nested: true,
            ..call(1_002_000, 400, "cuMemAlloc_v2", Some(4096), Some(0x7f00))
        };
        let failed = CallEvent {
            ret: 2,
            ..call(1_003_000, 100, "cudaMalloc", Some(1 << 40), None)
        };
        let mut free = call(1_005_000, 700, "cudaFree", None, Some(0x7f00));
        free.runnable_ns = 300;
        let wait = WaitEvent {
            pid: 10,
            tid: 11,
            kind: WaitKind::Preempted,
            off_ns: 1_005_100,
            wake_ns: 1_005_100,
            on_ns: 1_005_400,
            prev_state: 0,
            cpu: 0,
            culprits: vec![Culprit {
                pid: 99,
                tid: 99,
                comm: "hog".into(),
                ns: 300,
            }],
            waker: None,
        };
        for e in [
            Event::Call(malloc),
            Event::Call(nested),
            Event::Call(failed),
            Event::Call(free),
            Event::Wait(wait),
        ] {
            h.send(e).unwrap();
        }
        h.set_session_end(1_010_000).unwrap();
        drop(h);
        w.finish().unwrap();
    }

    /// A trace of `n` launches stored in start order, and with `late` a
    /// synchronize that starts before them all and is stored after them.
    fn launches(db: &Path, n: u64, late: bool) {
        let session = SessionInfo {
            start_mono_ns: 1_000_000,
            ..Default::default()
        };
        let w = writer(db, session);
        let h = w.handle();
        for i in 0..n {
            let launch = call(2_000_000 + i * 1_000, 300, "cudaLaunchKernel", None, None);
            h.send(Event::Call(launch)).unwrap();
        }
        if late {
            let sync = call(1_500_000, n * 1_000, "cudaDeviceSynchronize", None, None);
            h.send(Event::Call(sync)).unwrap();
        }
        h.set_session_end(2_000_000 + n * 1_000 + 1_000).unwrap();
        drop(h);
        w.finish().unwrap();
    }

    /// Into a file, the calls go straight through the reorder buffer; a
    /// trace with a call it cannot place is written again with its reach
    /// proved first. Either way the file holds what stdout gets (the proof
    /// first), in every format.
    #[test]
    fn a_file_the_buffer_cannot_order_is_written_again_the_same_as_stdout() {
        let calls = 40_000; // more than the buffer holds (2^15)
        for late in [false, true] {
            let db = temp_db(&format!("reach-{late}"));
            launches(&db, calls, late);
            let trace = Trace::open(&db).unwrap();
            let rows = Rows::open(&trace).unwrap();
            let frame = PerfettoFrame::of(&trace, None, false).unwrap();
            for format in [Format::Json, Format::Perfetto, Format::Pftrace] {
                let write = |w: &mut (dyn Write + Send), how: ByStart| match format {
                    Format::Json => write_calls_json(w, &rows, None, None, false, how),
                    Format::Perfetto => write_perfetto(w, &frame, &rows, None, None, how),
                    Format::Pftrace => write_pftrace(w, &frame, &rows, None, None, how),
                };
                let mut want = Vec::new();
                write(&mut want, ByStart::ProveFirst).unwrap();
                let out = db.with_extension("out");
                let _ = std::fs::remove_file(&out);
                let again = test_seams::WRITTEN_AGAIN.with(|c| c.get());
                write_file(&out, &db, false, write).unwrap();
                let written_again = test_seams::WRITTEN_AGAIN.with(|c| c.get()) - again;
                assert_eq!(written_again, usize::from(late), "late {late}");
                assert!(std::fs::read(&out).unwrap() == want, "late {late}");
                // Only the published file is left beside the trace.
                let tmp = sleuth_store::outfile::temp_path_for(&out);
                assert!(!tmp.exists(), "{}", tmp.display());
                std::fs::remove_file(&out).unwrap();
                // Stdout redirected to a file holding something already
                // (`>>`): the same, after it, and written again from there.
                std::fs::write(&out, b"before\n").unwrap();
                let f = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
                let start = stdout_file::ends_where_it_stands(&f).unwrap();
                let again = test_seams::WRITTEN_AGAIN.with(|c| c.get());
                write_regular(&f, start, b"\n", &write).unwrap();
                let written_again = test_seams::WRITTEN_AGAIN.with(|c| c.get()) - again;
                assert_eq!(written_again, usize::from(late), "stdout, late {late}");
                let got = std::fs::read(&out).unwrap();
                assert!(got[..7] == *b"before\n", "late {late}");
                assert!(got[7..got.len() - 1] == want, "stdout, late {late}");
                assert_eq!(got.last(), Some(&b'\n'));
                std::fs::remove_file(&out).unwrap();
            }
            if late {
                // The late call is the first in start order.
                let mut json = Vec::new();
                write_calls_json(&mut json, &rows, None, None, false, ByStart::ProveFirst).unwrap();
                let doc: Value = serde_json::from_slice(&json).unwrap();
                assert_eq!(doc[0]["op"], "cudaDeviceSynchronize");
                assert_eq!(doc.as_array().unwrap().len() as u64, calls + 1);
            }
            std::fs::remove_file(&db).unwrap();
        }
    }

    fn temp_db(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("gpusleuth-export-{tag}-{}.db", std::process::id()))
    }

    #[test]
    fn slices_counters_waits_and_nvml_tracks() {
        let db = temp_db("sim");
        simulated(&db);
        assert_identical(&db, None);
        let doc: Value = serde_json::from_slice(&streamed(&db, None, Format::Perfetto)).unwrap();
        let _ = std::fs::remove_file(&db);
        let ev = doc["traceEvents"].as_array().unwrap();
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 5, "four calls and one runnable slice");
        assert_eq!(x[0]["ts"], 2.0);
        assert_eq!(x[0]["dur"], 0.5);
        assert_eq!(x[0]["args"]["ptr"], "0x7f00");
        assert_eq!(x[0]["args"]["stream"], "0xabc");
        assert_eq!(x[0]["args"]["site"], "/w/t.py:3 step");
        assert!(x[1]["args"]["nested"] == true && x[0]["args"].get("nested").is_none());
        let run = x.iter().find(|e| e["cat"] == "sched.runnable").unwrap();
        assert_eq!(run["args"]["preemptors"], "hog (99)");
        let counters: Vec<u64> = ev
            .iter()
            .filter(|e| e["name"] == "device memory (bytes)")
            .map(|e| e["args"]["live_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(counters, vec![0, 4096, 0]);
        assert!(ev.iter().any(|e| e["name"] == "failed cudaMalloc"));
        let busy = ev.iter().find(|e| e["name"] == "GPU 0 busy (%)").unwrap();
        assert_eq!(
            (busy["ts"].as_f64(), busy["args"]["busy_pct"].as_f64()),
            (Some(1000.0), Some(40.0))
        );
        let held = ev
            .iter()
            .find(|e| e["name"] == "GPU 0 memory held, NVML (bytes)")
            .unwrap();
        assert_eq!(
            (held["pid"].as_u64(), held["args"]["used_bytes"].as_u64()),
            (Some(10), Some(1 << 30))
        );
        assert_eq!(doc["otherData"]["origin_mono_ns"], 1_000_000);
    }

    /// Calls of every op this build knows and of ids it does not (0, 31,
    /// 255, 65535), at times near and past the exact-decimal bound, each
    /// optional field present and absent, with a site (stack 7), a stack
    /// without frames (8) and a stack id no stack has (9).
    fn every_shape_of_call() -> Vec<CallEvent> {
        let ops: Vec<u16> = sleuth_core::ops::OPS
            .iter()
            .map(|o| o.id)
            .chain([0, 31, 255, u16::MAX])
            .collect();
        let times = [
            0,
            1,
            999,
            1_500,
            123_456_789,
            999_999_999_999_999,
            1_000_000_000_000_000,
            1_000_000_000_000_001,
            u64::MAX,
        ];
        let mut calls = Vec::new();
        for (i, &op) in ops.iter().enumerate() {
            for (j, &t) in times.iter().enumerate() {
                let k = i + j;
                calls.push(CallEvent {
                    ts_ns: t,
                    dur_ns: times[(j + 3) % times.len()],
                    pid: k as u32 * 7919,
                    tid: u32::MAX - k as u32,
                    op,
                    ret: [0, 2, -1, i64::MIN, i64::MAX][k % 5],
                    size: (k % 2 == 0).then_some(t),
                    ptr: (k % 3 == 0).then_some(t ^ 0xabc),
                    stream: (k % 4 != 1).then_some(k as u64),
                    kind: (k % 5 == 2).then_some(4),
                    host_ptr: None,
                    nested: k % 6 == 1,
                    runnable_ns: t / 3,
                    blocked_ns: t / 5,
                    cpu: k as u32,
                    stack_id: [None, Some(7), Some(8), Some(9)][k % 4],
                });
            }
        }
        calls
    }

    /// Every shape of call slice: with and without host context, each
    /// optional argument present and absent, a site and a stack whose
    /// labels need escapes, an op this build does not know, a void op,
    /// times near and past the exact-decimal bound and before the origin.
    #[test]
    fn a_call_slice_written_as_text_is_the_documents_byte_for_byte() {
        let frame = |kind, function: &str, file: Option<&str>, line| Frame {
            kind: Some(kind),
            function: Some(function.into()),
            file: file.map(Into::into),
            line,
            module: Some("/opt/lib \"x\"/libfoo.so".into()),
            addr: Some(0xdead_beef),
        };
        let stack = Stack {
            id: 7,
            pid: 1,
            frames: vec![
                frame(
                    FrameKind::Python,
                    "step\t\"q\"",
                    Some("/w/tr\\ain.py"),
                    Some(12),
                ),
                frame(FrameKind::Native, "ünï\u{1}code", None, None),
            ],
            notes: Vec::new(),
        };
        let empty = Stack {
            id: 8,
            pid: 1,
            frames: Vec::new(),
            notes: vec!["python frames truncated at 32".into()],
        };
        let mut compared = 0;
        for host in [true, false] {
            let mut data = TraceData {
                has_host_context: host,
                ..Default::default()
            };
            data.stacks.insert(7, stack.clone());
            data.stacks.insert(8, empty.clone());
            for c in every_shape_of_call() {
                for origin in [0, 1_000, u64::MAX] {
                    let mut text = Vec::new();
                    push_call_slice(&mut text, &c, &data, origin);
                    let doc = reference::call_slice(&c, &data, origin);
                    assert_eq!(
                        String::from_utf8(text).unwrap(),
                        serde_json::to_string(&doc).unwrap(),
                        "{c:?} origin {origin}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 2 * 60 * 9 * 3);
    }

    /// Every shape of `--format json` element (the calls of the slice
    /// test above, with and without host context) against the reference
    /// document's, byte for byte.
    #[test]
    fn a_json_call_written_as_text_is_the_documents_byte_for_byte() {
        for host in [true, false] {
            let data = TraceData {
                has_host_context: host,
                calls: every_shape_of_call(),
                ..Default::default()
            };
            let doc = reference::calls_json(&data);
            let elements = doc.as_array().expect("array");
            assert_eq!(elements.len(), data.calls.len());
            for (c, element) in data.calls.iter().zip(elements) {
                let mut text = Vec::new();
                push_json_call(&mut text, c, host);
                assert_eq!(
                    String::from_utf8(text).unwrap(),
                    serde_json::to_string(element).unwrap(),
                    "{c:?}"
                );
            }
        }
    }

    #[test]
    fn json_names_ops_and_leaves_unknown_split_null() {
        let db = temp_db("json");
        simulated(&db);
        let doc: Value = serde_json::from_slice(&streamed(&db, None, Format::Json)).unwrap();
        assert_eq!(doc[0]["op"], "cudaMalloc");
        assert_eq!(doc[0]["layer"], "runtime");
        assert_eq!(doc[0]["size"], 4096);
        assert_eq!(doc[0]["on_cpu_ns"], 500);
        assert_eq!(doc[2]["failed"], true);
        assert_eq!(doc[3]["runnable_ns"], 300);
        // Without host context (an import) the split is null, never 0.
        let trace = Trace::open(&db).unwrap();
        let mut out = Vec::new();
        let rows = Rows::open(&trace).unwrap();
        write_calls_json(&mut out, &rows, None, None, false, ByStart::ProveFirst).unwrap();
        let _ = std::fs::remove_file(&db);
        let doc: Value = serde_json::from_slice(&out).unwrap();
        assert!(doc[0]["on_cpu_ns"].is_null() && doc[0]["runnable_ns"].is_null());
        assert_eq!(doc[0]["dur_ns"], 500);
    }

    #[test]
    fn earliest_ts_searches_nested_evidence() {
        let v = json!({"a": {"first_ts_ns": 30}, "examples": [{"ts_ns": 20}, {"ts_ns": 40}]});
        assert_eq!(earliest_ts(&v), Some(20));
        assert_eq!(earliest_ts(&json!({"n": 1})), None);
    }
}

/// The Perfetto export from the lean load (stored aggregates) against the
/// full load, on the example traces written again through the writer: every
/// event but the findings byte-identical; the findings the same kinds, ops,
/// severities and processes (their evidence carries percentiles, equal
/// within the histogram's bound: `render::explain`'s lean tests check it).
#[cfg(test)]
mod lean_tests {
    use super::*;
    use crate::temp_dir::TempDir;
    use crate::trace_fixture::{example, rewrite, two_processes};

    fn perfetto(db: &Path, pid: Option<u32>) -> Value {
        super::tests::perfetto_doc(db, pid, None)
    }

    #[test]
    fn a_window_of_a_trace_with_rollups_holds_what_the_whole_export_holds_in_it() {
        let dir = TempDir::new("window");
        for name in ["demo-sim.db", "h200-contention.db"] {
            let path = dir.join(name);
            rewrite(
                &Trace::open(&example(name)).unwrap().load(None).unwrap(),
                &path,
            );
            super::tests::assert_window(&path);
        }
    }

    fn split(doc: &Value) -> (Vec<Value>, Vec<Value>) {
        let ev = doc["traceEvents"].as_array().unwrap();
        let (f, other): (Vec<&Value>, Vec<&Value>) = ev.iter().partition(|e| e["cat"] == "finding");
        let f = f
            .into_iter()
            .map(|e| {
                json!([
                    e["name"],
                    e["pid"],
                    e["args"]["severity"],
                    e["args"]["pids"]
                ])
            })
            .collect();
        (f, other.into_iter().cloned().collect())
    }

    #[test]
    fn lean_perfetto_export_equals_the_full_one_on_the_examples() {
        for name in ["demo-sim.db", "h200-contention.db"] {
            let data = Trace::open(&example(name)).unwrap().load(None).unwrap();
            compare(&data, name);
        }
    }

    /// Each process of a two-process trace (`--pid`) and the whole of it.
    #[test]
    fn lean_perfetto_export_of_one_process_equals_the_full_one() {
        compare(&two_processes(), "two processes");
    }

    /// The lean export of `data` written again, whole and of each of its
    /// processes, against the same file without its finding rollups.
    fn compare(data: &TraceData, name: &str) {
        let dir = TempDir::new(&format!("export-lean-{}", name.replace(' ', "-")));
        let lean_db = dir.join("lean.db");
        rewrite(data, &lean_db);
        let trace = Trace::open(&lean_db).unwrap();
        let pids: Vec<u32> = data.processes.iter().map(|p| p.pid).collect();
        for &pid in &pids {
            let budget = ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
            assert!(
                sleuth_store::lean::load(&trace, Some(pid), budget)
                    .unwrap()
                    .is_some(),
                "{name} pid {pid}: the lean load answers"
            );
        }
        let budget = ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
        assert!(
            sleuth_store::lean::load(&trace, None, budget)
                .unwrap()
                .is_some(),
            "{name}: the lean load answers"
        );
        drop(trace);
        // The same file without its finding rollups takes the full load.
        let full_db = dir.join("full.db");
        std::fs::copy(&lean_db, &full_db).unwrap();
        let c = rusqlite::Connection::open(&full_db).unwrap();
        c.execute("DELETE FROM meta WHERE key = 'finding_rollups'", [])
            .unwrap();
        drop(c);
        for pid in pids.iter().copied().map(Some).chain([None]) {
            let at = format!("{name} {pid:?}");
            let (lean, full) = (perfetto(&lean_db, pid), perfetto(&full_db, pid));
            assert_eq!(lean["otherData"], full["otherData"], "{at}");
            let (lf, lo) = split(&lean);
            let (ff, fo) = split(&full);
            assert!(!ff.is_empty(), "{at}: the example has findings");
            assert_eq!(lf, ff, "{at}: findings");
            assert_eq!(lo.len(), fo.len(), "{at}");
            for (a, b) in lo.iter().zip(&fo) {
                assert_eq!(a, b, "{at}");
            }
        }
    }
}
