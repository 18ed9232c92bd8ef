//! The trace command's sink for call sites. The capture session resolves
//! what needs the live process (Python code objects, the memory map) on the
//! draining thread; native function names come from the library files on a
//! thread of their own, because the first look at a large library
//! (PyTorch's are hundreds of MB) must not hold up the draining: a short
//! program would exit before its later stacks were read.

use sleuth_core::sites::Stack;
use sleuth_probe::sites::{SymbolFiles, Unsymbolized};
use sleuth_store::{StoreError, WriterHandle};
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

#[derive(Default)]
pub struct StackSink {
    /// Stacks waiting for native function names, and the thread naming them.
    symbolizer: Option<(Sender<Unsymbolized>, JoinHandle<()>)>,
    /// Symbols read on the draining thread, only if no thread could be started.
    inline_files: Option<SymbolFiles>,
}

impl Drop for StackSink {
    /// Waits for the stacks still being symbolized: they reach the writer
    /// before it finishes (the trace drops this sink first).
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.symbolizer.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

impl StackSink {
    /// Stores a stack: at once when every name is known, else after the
    /// symbolizer thread names its native frames.
    pub fn submit(&mut self, u: Unsymbolized, handle: &WriterHandle) -> Result<(), StoreError> {
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
