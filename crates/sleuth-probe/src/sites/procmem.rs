//! Reading a traced process's memory through /proc/PID/mem (root, or the
//! same rights ptrace needs).

use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct ProcMem {
    file: File,
}

impl ProcMem {
    pub fn open(pid: u32) -> Result<ProcMem, String> {
        File::open(format!("/proc/{pid}/mem"))
            .map(|file| ProcMem { file })
            .map_err(|e| format!("cannot read the memory of process {pid}: {e}"))
    }

    /// Fills `buf` from address `addr`, or fails (unmapped, process gone).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        self.file
            .read_exact_at(buf, addr)
            .map_err(|e| format!("cannot read {} bytes at {addr:#x}: {e}", buf.len()))
    }
}
