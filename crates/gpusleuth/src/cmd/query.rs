//! `gpusleuth query --db F "SQL" [--json] [--limit N]`: read-only SQL over a trace.

use crate::term_text;
use sleuth_store::{
    run_readonly_sql_remembered, ReadBudget, SqlLimits, SqlResult, DEFAULT_READ_TIMEOUT,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Trace database to query.
    #[arg(long)]
    db: PathBuf,
    /// One read-only SQL statement (schema: docs/schema.md).
    sql: String,
    #[command(flatten)]
    out: crate::args::JsonOutput,
    /// Most rows to return (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let limits = SqlLimits {
        max_rows: usize::try_from(args.limit).unwrap_or(usize::MAX),
        ..Default::default()
    };
    // The file's checks run under the command's deadline, not the
    // statement's time limit; those it passed in an earlier run are not
    // run again (`checks_memo`).
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    let result = run_readonly_sql_remembered(
        &args.db,
        &args.sql,
        &limits,
        &budget,
        crate::checks_memo::memo(),
    )?;
    if args.out.json {
        outln!("{}", serde_json::to_string(&result)?)?;
    } else {
        out!("{}", render_table(&result))?;
        if result.truncated {
            eprintln!(
                "(stopped at {} rows: {}; --json gives whole cells, --limit raises the row cap)",
                result.rows.len(),
                result.truncated_reason.as_deref().unwrap_or("cap reached")
            );
        }
    }
    Ok(0)
}

/// Widest a cell is shown in the table (`--json` gives whole values).
const CELL_CHARS: usize = 200;

/// A value as one escaped, bounded line.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "NULL".into(),
        serde_json::Value::String(s) => term_text::cell(s, CELL_CHARS),
        // A BLOB, shown as SQLite spells its literal.
        serde_json::Value::Object(o) => match o.get(sleuth_store::BLOB_HEX_KEY) {
            Some(serde_json::Value::String(hex)) if o.len() == 1 => {
                term_text::cell(&format!("x'{hex}'"), CELL_CHARS)
            }
            _ => term_text::cell(&v.to_string(), CELL_CHARS),
        },
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell; numbers right-aligned.
fn render_table(r: &SqlResult) -> String {
    let cells: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| row.iter().map(cell).collect())
        .collect();
    let columns: Vec<String> = r
        .columns
        .iter()
        .map(|c| term_text::cell(c, CELL_CHARS))
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.chars().count()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..r.columns.len())
        .map(|i| {
            !r.rows.is_empty()
                && r.rows
                    .iter()
                    .all(|row| row[i].is_number() || row[i].is_null())
        })
        .collect();
    let mut out = String::new();
    let line = |vals: &[String], out: &mut String| {
        let parts: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if numeric[i] {
                    term_text::pad_left(v, widths[i])
                } else {
                    term_text::pad_right(v, widths[i])
                }
            })
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&columns, &mut out);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for row in &cells {
        line(row, &mut out);
    }
    out.push_str(&format!(
        "({} row{})\n",
        r.rows.len(),
        if r.rows.len() == 1 { "" } else { "s" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_aligns_columns_and_counts_rows() {
        let r = SqlResult {
            columns: vec!["op".into(), "n".into()],
            rows: vec![
                vec![json!("cudaMalloc"), json!(7)],
                vec![json!("cuMemAlloc_v2"), json!(10)],
            ],
            truncated: false,
            truncated_reason: None,
        };
        let t = render_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "op              n");
        assert_eq!(lines[2], "cudaMalloc      7");
        assert_eq!(lines[3], "cuMemAlloc_v2  10");
        assert_eq!(lines[4], "(2 rows)");
    }

    /// Issue 18: a 65,536-character cell panicked in `format!` padding.
    #[test]
    fn huge_and_hostile_cells_are_bounded_and_escaped() {
        let r = SqlResult {
            columns: vec!["wide".into(), "n".into()],
            rows: vec![
                vec![json!("a".repeat(70_000)), json!(1)],
                vec![json!("\u{1b}[2J\u{1b}]0;x\u{7}"), json!(2)],
            ],
            truncated: false,
            truncated_reason: None,
        };
        let t = render_table(&r);
        assert!(!t.contains('\u{1b}'), "{t}");
        assert!(t.contains("\\x1b[2J"), "{t}");
        assert!(t.lines().all(|l| l.chars().count() < 400), "bounded width");
    }

    #[test]
    fn a_blob_is_shown_as_its_literal() {
        let r = SqlResult {
            columns: vec!["b".into(), "o".into()],
            rows: vec![vec![
                json!({ "blob_hex": "00ff" }),
                json!({ "blob_hex": "00", "other": 1 }),
            ]],
            truncated: false,
            truncated_reason: None,
        };
        let t = render_table(&r);
        assert!(t.lines().nth(2).unwrap().starts_with("x'00ff'"), "{t}");
        assert!(t.contains(r#"{"blob_hex":"00","other":1}"#), "{t}");
    }
}
