//! Which Linux capabilities this process holds, and whether they are enough
//! to trace.
//!
//! What the kernel asks for (measured on 6.18.44 with `setpriv`, see
//! docs/deploy.md):
//! - loading the programs and maps, and the `tp_btf` scheduler tracepoints:
//!   CAP_BPF + CAP_PERFMON (CAP_SYS_ADMIN stands in for either);
//! - batched uprobes (`BPF_LINK_CREATE` with `BPF_TRACE_UPROBE_MULTI`,
//!   Linux 6.6+): nothing more;
//! - one-by-one uprobes through `perf_event_open` (the fallback on kernels
//!   without uprobe_multi): CAP_SYS_ADMIN on kernels carrying upstream's
//!   "perf: Revert to requiring CAP_SYS_ADMIN for uprobes" (6.16, backported
//!   to stable), CAP_PERFMON on 5.8 to 6.15.
//!
//! So the preflight requires CAP_BPF and CAP_PERFMON only; a library whose
//! uprobes are then refused is reported per library, naming CAP_SYS_ADMIN
//! when it is the missing piece ([`Caps::uprobe_hint`]).

pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// An effective capability set (`CapEff` of /proc/PID/status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps(pub u64);

impl Caps {
    /// This process's effective set.
    pub fn current() -> Result<Caps, String> {
        let status = std::fs::read_to_string("/proc/self/status")
            .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
        Caps::from_status(&status)
    }

    /// Parses the `CapEff:` line of a /proc/PID/status text.
    pub fn from_status(status: &str) -> Result<Caps, String> {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .ok_or("no CapEff line in /proc/self/status")?
            .trim();
        u64::from_str_radix(hex, 16)
            .map(Caps)
            .map_err(|_| format!("unreadable CapEff '{hex}' in /proc/self/status"))
    }

    pub fn has(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1u64 << cap) != 0
    }

    /// The first capability missing for loading the programs and attaching
    /// the tracepoints, by name; None when tracing can start.
    /// CAP_SYS_ADMIN covers both (kernels before 5.8 know only it).
    pub fn missing_for_tracing(self) -> Option<&'static str> {
        if self.has(CAP_SYS_ADMIN) {
            return None;
        }
        if !self.has(CAP_BPF) {
            return Some("CAP_BPF");
        }
        if !self.has(CAP_PERFMON) {
            return Some("CAP_PERFMON");
        }
        None
    }

    /// What to add to a refused one-by-one uprobe attach: the kernel may want
    /// CAP_SYS_ADMIN for the uprobe PMU. Empty when it is already held.
    pub fn uprobe_hint(self) -> &'static str {
        if self.has(CAP_SYS_ADMIN) {
            ""
        } else {
            "; one-by-one uprobes (perf_event_open) need CAP_SYS_ADMIN on this kernel, which gpusleuth does not hold"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(capeff: &str) -> String {
        format!("Name:\tgpusleuth\nCapInh:\t0000000000000000\nCapPrm:\t{capeff}\nCapEff:\t{capeff}\nCapBnd:\t000001ffffffffff\n")
    }

    #[test]
    fn parses_capeff_and_decides() {
        // Full root set of a 6.x kernel.
        let root = Caps::from_status(&status("000001ffffffffff")).unwrap();
        assert!(root.has(CAP_BPF) && root.has(CAP_PERFMON) && root.has(CAP_SYS_ADMIN));
        assert_eq!(root.missing_for_tracing(), None);
        assert_eq!(root.uprobe_hint(), "");

        // setpriv ... +bpf,+perfmon: bits 38 and 39.
        let bpf_perfmon = Caps::from_status(&status("000000c000000000")).unwrap();
        assert_eq!(bpf_perfmon, Caps((1 << 38) | (1 << 39)));
        assert_eq!(bpf_perfmon.missing_for_tracing(), None);
        assert!(bpf_perfmon.uprobe_hint().contains("CAP_SYS_ADMIN"));

        let bpf_only = Caps::from_status(&status("0000008000000000")).unwrap();
        assert_eq!(bpf_only.missing_for_tracing(), Some("CAP_PERFMON"));
        let perfmon_only = Caps::from_status(&status("0000004000000000")).unwrap();
        assert_eq!(perfmon_only.missing_for_tracing(), Some("CAP_BPF"));
        let none = Caps::from_status(&status("0000000000000000")).unwrap();
        assert_eq!(none.missing_for_tracing(), Some("CAP_BPF"));
        // CAP_SYS_ADMIN alone (pre-5.8 style) is enough.
        let admin = Caps::from_status(&status("0000000000200000")).unwrap();
        assert_eq!(admin.missing_for_tracing(), None);
    }

    #[test]
    fn rejects_missing_or_garbled_capeff() {
        assert!(Caps::from_status("Name:\tx\n").is_err());
        assert!(Caps::from_status("CapEff:\tzz\n").is_err());
        assert!(!Caps(u64::MAX).has(64));
    }

    #[test]
    fn reads_this_process() {
        // Whatever we hold, /proc/self/status has a parseable CapEff.
        assert!(Caps::current().is_ok());
    }
}
