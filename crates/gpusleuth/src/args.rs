//! Arguments shared by several commands (`#[command(flatten)]`), and the
//! value parsers every time and size option uses, so `--db`, `--pid`,
//! `--json`, `1.5s` and `512M` mean the same thing to every command.

use std::path::PathBuf;
use std::time::Duration;

/// The trace a command reads, and the process it looks at.
#[derive(clap::Args, Clone, Debug)]
pub struct TraceInput {
    /// Trace database written by `gpusleuth trace` (or `import`).
    #[arg(long)]
    pub db: PathBuf,
    /// Only this process.
    #[arg(long)]
    pub pid: Option<u32>,
}

/// `--json`: the command's documented machine-readable contract.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct JsonOutput {
    /// Machine-readable output (the command's documented JSON contract).
    #[arg(long)]
    pub json: bool,
}

/// A duration with a unit (`1.5s`, `250ms`, `40us`, `2m`); 0 allowed.
pub fn duration(s: &str) -> Result<Duration, String> {
    sleuth_core::units::parse_duration_ns(s).map(Duration::from_nanos)
}

/// [`duration`], more than zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        Duration::ZERO => Err(format!("'{s}' is not a positive duration")),
        d => Ok(d),
    }
}

/// A duration with a unit, as nanoseconds (`memory --at`).
pub fn duration_ns(s: &str) -> Result<u64, String> {
    sleuth_core::units::parse_duration_ns(s)
}

/// A size in bytes (`512M`, `2G`, `64KiB`, plain bytes).
pub fn size(s: &str) -> Result<u64, String> {
    sleuth_core::units::parse_size(s)
}

/// The smallest `trace --max-db`: a finished file's tables, indexes and
/// rollups alone take 180-260 KB, and the cap is checked after a commit,
/// so a smaller cap stored the first batch whole with 0 drops (`--max-db 1`
/// stored the whole trace: round 51's tester).
pub const MIN_MAX_DB: u64 = 1 << 20;

/// A `--max-db` value: a size of at least [`MIN_MAX_DB`].
pub fn db_cap(s: &str) -> Result<u64, String> {
    let v = size(s)?;
    if v < MIN_MAX_DB {
        return Err(format!(
            "{s} is below 1M: a trace's tables alone take about 256K, and the cap is checked after each commit"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Probe {
        #[command(flatten)]
        input: TraceInput,
        #[command(flatten)]
        out: JsonOutput,
        #[arg(long, value_parser = positive_duration)]
        every: Option<Duration>,
    }

    #[test]
    fn a_database_cap_below_a_files_tables_is_refused() {
        assert_eq!(db_cap("1M"), Ok(1 << 20));
        assert_eq!(db_cap("2G"), Ok(2 << 30));
        for small in ["1", "1023K"] {
            let e = db_cap(small).unwrap_err();
            assert!(e.contains("below 1M"), "{small}: {e}");
        }
    }

    #[test]
    fn shared_arguments_parse_and_a_bare_number_gets_the_hint() {
        let p = Probe::try_parse_from([
            "x", "--db", "t.db", "--pid", "7", "--json", "--every", "250ms",
        ])
        .expect("valid arguments");
        assert_eq!(p.input.db, PathBuf::from("t.db"));
        assert_eq!(p.input.pid, Some(7));
        assert!(p.out.json);
        assert_eq!(p.every, Some(Duration::from_millis(250)));
        let Err(e) = Probe::try_parse_from(["x", "--db", "t.db", "--every", "1.5"]) else {
            panic!("a bare number was accepted");
        };
        assert!(e.to_string().contains("write 1.5s"), "{e}");
        assert!(Probe::try_parse_from(["x", "--db", "t.db", "--every", "0"]).is_err());
    }
}
