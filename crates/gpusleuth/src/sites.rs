//! The trace command's side of call sites: which traced processes run
//! CPython (told to the kernel so it walks their frames), and resolving each
//! new stack while its process is alive.

use sleuth_core::record::RawStack;
use sleuth_core::sites::Stack;
use sleuth_probe::sites::{python, SiteResolver, SymbolFiles, Unsymbolized};
use sleuth_probe::Capture;
use sleuth_store::{NoteLevel, StoreError, WriterHandle};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long after exec (or first sight) a process is looked at for CPython:
/// libpython is mapped by the dynamic loader right after exec, well within this.
const WATCH_FOR: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct SiteSession {
    resolver: SiteResolver,
    /// Processes to look at for CPython, until the deadline.
    watching: HashMap<u32, Instant>,
    /// Distinct stacks resolved and sent to the database.
    pub stored: u64,
    /// Stacks waiting for native function names, and the thread naming them.
    symbolizer: Option<(Sender<Unsymbolized>, JoinHandle<()>)>,
    /// Symbols read on the draining thread, only if no thread could be started.
    inline_files: Option<SymbolFiles>,
}

impl Drop for SiteSession {
    /// Waits for the stacks still being symbolized: they reach the writer
    /// before it finishes (the trace drops this session first).
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.symbolizer.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

impl SiteSession {
    /// Looks for CPython in `pid` over the next seconds (a new program).
    pub fn watch(&mut self, pid: u32) {
        if self.resolver.python(pid).is_none() {
            self.watching.insert(pid, Instant::now() + WATCH_FOR);
        }
    }

    /// Forgets what was known of a process (exec: a new program; exit).
    pub fn forget(&mut self, pid: u32) {
        self.resolver.forget(pid);
        self.watching.remove(&pid);
    }

    /// Registers CPython in watched processes; returns notes to store.
    pub fn find_python(&mut self, cap: &mut Capture) -> Vec<(NoteLevel, String)> {
        let mut notes = Vec::new();
        if self.watching.is_empty() {
            return notes;
        }
        let now = Instant::now();
        let pids: Vec<u32> = self.watching.keys().copied().collect();
        for pid in pids {
            match python::detect(pid) {
                Ok(Some(p)) => {
                    self.watching.remove(&pid);
                    match cap.set_python(pid, p.kernel_layout()) {
                        Ok(()) => {
                            notes.push((
                                NoteLevel::Info,
                                format!(
                                    "pid {pid} runs Python 3.{} ({}): call sites include Python frames from here on",
                                    p.layout.minor,
                                    p.file.display()
                                ),
                            ));
                            self.resolver.set_python(p);
                        }
                        Err(e) => notes.push((
                            NoteLevel::Warn,
                            format!("Python frames of pid {pid} not captured: {e}"),
                        )),
                    }
                }
                Ok(None) => {
                    if self.watching.get(&pid).is_some_and(|&d| now >= d) {
                        self.watching.remove(&pid);
                    }
                }
                Err(e) => {
                    self.watching.remove(&pid);
                    notes.push((
                        NoteLevel::Warn,
                        format!("Python frames of pid {pid} not captured: {e}"),
                    ));
                }
            }
        }
        notes
    }

    /// Resolves a stack and sends it to the database. What needs the live
    /// process (Python code objects, the memory map) is read now, before the
    /// next record is drained; native function names come from the library
    /// files on a thread of their own, because the first look at a large
    /// library (PyTorch's are hundreds of MB) must not hold up the draining:
    /// a short program would exit before its later stacks were read.
    pub fn submit(&mut self, raw: &RawStack, handle: &WriterHandle) -> Result<(), StoreError> {
        self.stored += 1;
        let u = self.resolver.resolve_live(raw);
        if u.is_complete() {
            return handle.add_stack(u.finish(&mut SymbolFiles::default()));
        }
        if self.symbolizer.is_none() {
            self.symbolizer = spawn_symbolizer(handle.clone());
        }
        let u = match &self.symbolizer {
            Some((tx, _)) => match tx.send(u) {
                Ok(()) => return Ok(()),
                Err(back) => back.0,
            },
            None => u,
        };
        // No symbolizer thread (it could not be started): name the frames
        // here, as slow as that may be, rather than lose the stack.
        handle.add_stack(u.finish(self.inline_files.get_or_insert_with(SymbolFiles::default)))
    }
}

/// The thread that adds native function names and stores the stacks.
fn spawn_symbolizer(handle: WriterHandle) -> Option<(Sender<Unsymbolized>, JoinHandle<()>)> {
    let (tx, rx) = channel::<Unsymbolized>();
    let thread = std::thread::Builder::new()
        .name("gpusleuth-sym".into())
        .spawn(move || {
            let mut files = SymbolFiles::default();
            for u in rx {
                let stack: Stack = u.finish(&mut files);
                // A writer that failed is reported by the draining thread.
                let _ = handle.add_stack(stack);
            }
        });
    thread.ok().map(|t| (tx, t))
}
