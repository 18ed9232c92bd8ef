//! The trace command's side of call sites: which traced processes run
//! CPython (told to the kernel so it walks their frames), and resolving each
//! new stack while its process is alive.

use sleuth_core::record::RawStack;
use sleuth_core::sites::Stack;
use sleuth_probe::sites::{python, SiteResolver};
use sleuth_probe::Capture;
use sleuth_store::NoteLevel;
use std::collections::HashMap;
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

    /// Resolves a stack now, while its process is alive.
    pub fn resolve(&mut self, raw: &RawStack) -> Stack {
        self.stored += 1;
        self.resolver.resolve(raw)
    }
}
