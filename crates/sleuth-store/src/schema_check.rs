//! Readers accept only the schema gpusleuth writes.
//!
//! A trace from elsewhere can replace `calls` by a recursive view (every
//! read then hangs), add generated columns that run functions on each row,
//! or hang expression indexes on our tables. Before anything reads a file,
//! every table the readers use must be a plain table with the expected
//! columns and declared types, and its indexes plain column indexes.
//! The reference is `schema::CREATE` itself, built in memory, so the check
//! follows the schema without a second list to keep in sync.
//!
//! Version 2 reads calls through a view, `calls`: a view is SQL from the
//! file that every read runs, so it is accepted only with exactly the text
//! gpusleuth writes (`schema::CALLS_VIEW`), over the plain tables checked
//! here. Version 1 files (still read) have a plain `calls` table instead.
//! Version 3 reads allocator events through a view too (`allocator_events`
//! over `allocator_rows`, `schema::ALLOCATOR_VIEW_V3`; version 4's,
//! `schema::ALLOCATOR_VIEW_V4`, also joins each row's `base_id` row;
//! version 5's, `schema::ALLOCATOR_VIEW`, computes the start, the thread and
//! the base row), accepted the same way; earlier files have it as a plain
//! table. Version 6 computes some columns of `call_rows` and `waits`
//! (`schema::GENERATED_TABLES`): those two tables are accepted with
//! generated columns only in a version 6 file and only with exactly the
//! text gpusleuth writes, as the views are; earlier versions' tables are
//! `schema::CALL_ROWS_V5` and `schema::WAITS_V5`.

use crate::schema::{
    ALLOCATOR_EVENTS_V2, ALLOCATOR_VIEW, ALLOCATOR_VIEW_V3, ALLOCATOR_VIEW_V4, CALLS_V1,
    CALLS_VIEW, CALL_ROWS_V5, CREATE, GENERATED_TABLES, WAITS_V5,
};
use rusqlite::{Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Tables every trace has had since schema version 1; any other table of
/// `CREATE` (added later, e.g. `allocator_events`) may be absent in older
/// traces, but is checked like the others when present.
const REQUIRED: &[&str] = &[
    "meta",
    "session",
    "stats",
    "libraries",
    "notes",
    "processes",
    "proc_events",
    "waits",
    "wait_culprits",
    "call_culprits",
    "op_counts",
];

/// Table name → its columns (name, declared type, lower case), in order.
type Columns = BTreeMap<String, Vec<(String, String)>>;

/// Tables every trace of `version` has besides [`REQUIRED`].
fn required_of(version: i64) -> &'static [&'static str] {
    match version {
        1 => &["calls"],
        2 => &["call_rows", "ops"],
        // Every version 3 file has them (and the view over them).
        _ => &["call_rows", "ops", "allocator_rows"],
    }
}

/// The tables of `version` as gpusleuth creates them, in memory.
fn reference_db(version: i64) -> rusqlite::Result<Connection> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(CREATE)?;
    if version < 6 {
        conn.execute_batch(&format!(
            "DROP TABLE call_rows; {CALL_ROWS_V5}; DROP TABLE waits; {WAITS_V5};"
        ))?;
    }
    if version == 1 {
        conn.execute_batch(&format!(
            "DROP TABLE call_rows; DROP TABLE ops; {CALLS_V1};"
        ))?;
    }
    if version < 3 {
        conn.execute_batch(&format!(
            "DROP TABLE allocator_rows; {ALLOCATOR_EVENTS_V2};"
        ))?;
    } else if version < 5 {
        conn.execute_batch(
            "ALTER TABLE allocator_rows RENAME COLUMN dur_ns TO start_ns;
             ALTER TABLE allocator_rows RENAME COLUMN base_back TO base_id;",
        )?;
        if version == 3 {
            conn.execute_batch("ALTER TABLE allocator_rows DROP COLUMN base_id")?;
        }
    }
    Ok(conn)
}

/// What a file of one version is checked against: its tables' columns
/// and the text of the tables whose columns are computed.
struct Reference {
    columns: Columns,
    generated_sql: BTreeMap<String, Option<String>>,
}

impl Reference {
    fn of(version: i64) -> rusqlite::Result<Reference> {
        let ours = reference_db(version)?;
        let mut generated_sql = BTreeMap::new();
        for table in GENERATED_TABLES {
            generated_sql.insert(table.to_string(), table_sql(&ours, table)?);
        }
        Ok(Reference {
            columns: reference(&ours)?,
            generated_sql,
        })
    }
}

/// The reference of `version`, built once per process: building it runs
/// the whole schema in memory, and a run's readers open each of its files
/// several times (a `report` of a 59-file run spent 23% of its time
/// there, round 38).
fn reference_of(version: i64) -> rusqlite::Result<Arc<Reference>> {
    static BUILT: Mutex<BTreeMap<i64, Arc<Reference>>> = Mutex::new(BTreeMap::new());
    // A panic elsewhere while it was held leaves the map whole: each entry
    // is inserted complete.
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = built.get(&version) {
        return Ok(Arc::clone(r));
    }
    let r = Arc::new(Reference::of(version)?);
    #[cfg(test)]
    REFERENCES_BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    built.insert(version, Arc::clone(&r));
    Ok(r)
}

/// References built by this process (the tests count them).
#[cfg(test)]
static REFERENCES_BUILT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn reference(conn: &Connection) -> rusqlite::Result<Columns> {
    let names: Vec<String> = {
        let mut st = conn.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
        )?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut out = Columns::new();
    for name in names {
        let cols = columns(conn, &name)?
            .into_iter()
            .map(|(n, t, _hidden)| (n, t))
            .collect();
        out.insert(name, cols);
    }
    Ok(out)
}

/// `(name, declared type, hidden)` of each column, hidden ones included.
fn columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<(String, String, i64)>> {
    let mut st = conn.prepare_cached("SELECT name, type, hidden FROM pragma_table_xinfo(?1)")?;
    let rows = st.query_map([table], |r| {
        Ok((
            r.get::<_, String>(0)?.to_ascii_lowercase(),
            r.get::<_, String>(1)?.to_ascii_lowercase(),
            r.get::<_, i64>(2)?,
        ))
    })?;
    rows.collect()
}

/// Why the file's schema is not one gpusleuth reads; `Ok(())` when it is.
/// The outer `Err` is SQLite failing while looking.
/// `version` is the file's `meta.schema_version` (already checked to be one
/// of `schema::READABLE_VERSIONS`).
pub(crate) fn check(conn: &Connection, version: i64) -> rusqlite::Result<Result<(), String>> {
    let ours = reference_of(version)?;
    for (table, want_cols) in &ours.columns {
        let found: Option<(String, Option<String>)> = {
            // Cached: the same statements run for each of the ~50 tables.
            let mut st = conn.prepare_cached(
                "SELECT type, sql FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
            )?;
            let mut rows = st.query([table])?;
            match rows.next()? {
                Some(r) => Some((r.get(0)?, r.get(1)?)),
                None => None,
            }
        };
        let Some((kind, sql)) = found else {
            if REQUIRED.contains(&table.as_str()) || required_of(version).contains(&table.as_str())
            {
                return Ok(Err(format!("table {table} is missing")));
            }
            continue;
        };
        if kind != "table" {
            return Ok(Err(format!(
                "{table} is a {kind}, not a table (gpusleuth writes a table)"
            )));
        }
        let sql = sql.unwrap_or_default();
        if sql
            .to_ascii_uppercase()
            .trim_start()
            .starts_with("CREATE VIRTUAL")
        {
            return Ok(Err(format!("{table} is a virtual table")));
        }
        let have = columns(conn, table)?;
        if let Some((name, _, _)) = have.iter().find(|c| c.2 != 0) {
            // Version 6 computes some columns: SQL from the file that every
            // read runs, so accepted only as gpusleuth writes it, word for word.
            let generated_here = version >= 6 && GENERATED_TABLES.contains(&table.as_str());
            if !generated_here
                || Some(&sql) != ours.generated_sql.get(table).and_then(Option::as_ref)
            {
                return Ok(Err(format!(
                    "{table}.{name} is a hidden or generated column{}",
                    if generated_here {
                        " not written by gpusleuth"
                    } else {
                        ""
                    }
                )));
            }
        }
        for (name, ty) in want_cols {
            match have.iter().find(|c| &c.0 == name) {
                None => return Ok(Err(format!("{table} has no column {name}"))),
                Some((_, t, _)) if t != ty => {
                    return Ok(Err(format!(
                        "{table}.{name} is declared {t:?}, expected {ty:?}"
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some(why) = odd_index(conn, table)? {
            return Ok(Err(why));
        }
    }
    let mut views = Vec::new();
    if version != 1 {
        views.push(("calls", CALLS_VIEW));
    }
    match version {
        ..=2 => {}
        3 => views.push(("allocator_events", ALLOCATOR_VIEW_V3)),
        4 => views.push(("allocator_events", ALLOCATOR_VIEW_V4)),
        _ => views.push(("allocator_events", ALLOCATOR_VIEW)),
    }
    for (name, text) in views {
        if let Some(why) = odd_view(conn, name, text)? {
            return Ok(Err(why));
        }
    }
    if version != 1 {
        // Every call row carries its op's name through the view: one
        // megabyte-long name would be copied once per call.
        let long: i64 = conn.query_row(
            &format!("SELECT count(*) FROM ops WHERE length(op) > {OP_CHARS} OR length(layer) > {OP_CHARS}"),
            [],
            |r| r.get(0),
        )?;
        if long > 0 {
            return Ok(Err(format!(
                "ops holds {long} name(s) longer than {OP_CHARS} characters"
            )));
        }
    }
    Ok(Ok(()))
}

/// The text `CREATE TABLE` statement of `table` in `conn`.
fn table_sql(conn: &Connection, table: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |r| r.get(0),
    )
    .optional()
    .map(Option::flatten)
}

/// Why view `name` is not exactly the one gpusleuth writes (`text`): a
/// view is SQL from the file that every read of it runs.
fn odd_view(conn: &Connection, name: &str, text: &str) -> rusqlite::Result<Option<String>> {
    let view: Option<(String, Option<String>)> = conn
        .query_row(
            "SELECT type, sql FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match view {
        None => Some(format!("view {name} is missing")),
        Some((kind, sql)) if kind != "view" || sql.as_deref() != Some(text) => Some(format!(
            "{name} is a {kind} that is not the view gpusleuth writes"
        )),
        Some(_) => None,
    })
}

/// Longest op or layer name `ops` may hold (CUDA's longest symbols are
/// about 40 characters).
const OP_CHARS: i64 = 200;

/// Partial indexes gpusleuth itself creates, by name and exact SQL: their
/// `WHERE` is a plain NULL test, and a file that changes it is refused.
const OUR_PARTIAL_INDEXES: &[(&str, &str)] = &[
    (
        "calls_stack",
        "CREATE INDEX calls_stack ON calls(stack_id) WHERE stack_id IS NOT NULL",
    ),
    (
        "call_rows_stack",
        "CREATE INDEX call_rows_stack ON call_rows(stack_id) WHERE stack_id IS NOT NULL",
    ),
];

fn is_our_partial_index(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    let Some((_, want)) = OUR_PARTIAL_INDEXES.iter().find(|(n, _)| *n == name) else {
        return Ok(false);
    };
    let sql: Option<String> = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()?
        .flatten();
    Ok(sql.as_deref() == Some(*want))
}

/// A partial or expression index on `table` (SQLite evaluates those while
/// reading or checking the file); `None` when every index is on plain columns.
fn odd_index(conn: &Connection, table: &str) -> rusqlite::Result<Option<String>> {
    let indexes: Vec<(String, i64)> = {
        let mut st = conn.prepare_cached("SELECT name, partial FROM pragma_index_list(?1)")?;
        let rows = st.query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (name, partial) in indexes {
        if partial != 0 && !is_our_partial_index(conn, &name)? {
            return Ok(Some(format!("index {name} on {table} is a partial index")));
        }
        let expr: i64 = conn
            .prepare_cached("SELECT count(*) FROM pragma_index_xinfo(?1) WHERE cid = -2")?
            .query_row([&name], |r| r.get(0))?;
        if expr > 0 {
            return Ok(Some(format!(
                "index {name} on {table} indexes an expression"
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SCHEMA_VERSION;

    /// A database as gpusleuth creates it (this version).
    fn fresh() -> Connection {
        let c = Connection::open_in_memory().expect("db");
        crate::schema::create(&c, "gpusleuth", "test").expect("schema");
        c
    }

    /// A version 5 database: every column of `call_rows` and `waits`
    /// stored (none generated).
    fn fresh_v5() -> Connection {
        let c = fresh();
        c.execute_batch(&format!(
            "DROP TABLE call_rows; {CALL_ROWS_V5};
             CREATE INDEX call_rows_stack ON call_rows(stack_id) WHERE stack_id IS NOT NULL;
             DROP TABLE waits; {WAITS_V5}; CREATE INDEX waits_tid_on ON waits(tid, on_ns);"
        ))
        .expect("v5");
        c
    }

    /// A version 4 database: each allocator row's start, thread and base
    /// row's id stored as they are, read through version 4's view.
    fn fresh_v4() -> Connection {
        let c = fresh_v5();
        c.execute_batch(&format!(
            "DROP VIEW allocator_events;
             ALTER TABLE allocator_rows RENAME COLUMN dur_ns TO start_ns;
             ALTER TABLE allocator_rows RENAME COLUMN base_back TO base_id;
             {ALLOCATOR_VIEW_V4};"
        ))
        .expect("v4");
        c
    }

    /// A version 3 database: every allocator row stores its 16 words (no
    /// `base_id`), read through version 3's view.
    fn fresh_v3() -> Connection {
        let c = fresh_v4();
        c.execute_batch(&format!(
            "DROP VIEW allocator_events; ALTER TABLE allocator_rows DROP COLUMN base_id;
             {ALLOCATOR_VIEW_V3};"
        ))
        .expect("v3");
        c
    }

    /// A version 2 database: the allocator events a table, the op's name
    /// in each row, the words one BLOB.
    fn fresh_v2() -> Connection {
        let c = fresh_v5();
        c.execute_batch(&format!(
            "DROP VIEW allocator_events; DROP TABLE allocator_rows; {ALLOCATOR_EVENTS_V2};
             ALTER TABLE allocator_events ADD COLUMN stack_id INTEGER;
             CREATE INDEX allocator_events_pid ON allocator_events(pid, end_ns);"
        ))
        .expect("v2");
        c
    }

    /// A version 1 database: `calls` a table, no `call_rows` or `ops`.
    fn fresh_v1() -> Connection {
        let c = fresh_v2();
        c.execute_batch(&format!(
            "DROP VIEW call_sites; DROP VIEW calls_wall; DROP VIEW op_summary;
             DROP VIEW call_culprits_named; DROP VIEW calls; DROP TABLE call_rows; DROP TABLE ops;
             {CALLS_V1}; ALTER TABLE calls ADD COLUMN stack_id INTEGER;
             CREATE INDEX calls_stack ON calls(stack_id) WHERE stack_id IS NOT NULL;
             CREATE INDEX calls_pid_op ON calls(pid, op);"
        ))
        .expect("v1");
        c
    }

    #[test]
    fn our_schema_passes() {
        assert_eq!(check(&fresh(), SCHEMA_VERSION).expect("check"), Ok(()));
        assert_eq!(check(&fresh_v5(), 5).expect("check"), Ok(()));
        assert_eq!(check(&fresh_v4(), 4).expect("check"), Ok(()));
        assert_eq!(check(&fresh_v3(), 3).expect("check"), Ok(()));
        assert_eq!(check(&fresh_v2(), 2).expect("check"), Ok(()));
        assert_eq!(check(&fresh_v1(), 1).expect("check"), Ok(()));
    }

    #[test]
    fn each_versions_reference_is_built_once_and_still_refuses() {
        use std::sync::atomic::Ordering::Relaxed;
        // Every version built (here or by a test beside it), then none again.
        for v in crate::schema::READABLE_VERSIONS {
            reference_of(*v).expect("reference");
        }
        let built = REFERENCES_BUILT.load(Relaxed);
        assert!(built <= crate::schema::READABLE_VERSIONS.len(), "{built}");
        for _ in 0..3 {
            assert_eq!(check(&fresh(), SCHEMA_VERSION).expect("check"), Ok(()));
            assert_eq!(check(&fresh_v1(), 1).expect("check"), Ok(()));
            // The kept reference still finds what the file lacks.
            let odd = fresh();
            odd.execute_batch("ALTER TABLE notes DROP COLUMN level")
                .expect("drop");
            let why = check(&odd, SCHEMA_VERSION)
                .expect("check")
                .expect_err("refused");
            assert!(why.contains("notes has no column level"), "{why}");
        }
        assert_eq!(REFERENCES_BUILT.load(Relaxed), built);
    }

    #[test]
    fn each_version_needs_its_own_calls() {
        let why = check(&fresh_v1(), 2).expect("check").expect_err("refused");
        assert!(why.contains("missing"), "{why}");
        let why = check(&fresh_v2(), 1).expect("check").expect_err("refused");
        assert!(why.contains("calls is a view"), "{why}");
    }

    #[test]
    fn each_version_needs_its_own_allocator_events() {
        let why = check(&fresh(), 2).expect("check").expect_err("refused");
        assert!(
            why.contains("allocator_events is a view, not a table"),
            "{why}"
        );
        let why = check(&fresh_v2(), 3).expect("check").expect_err("refused");
        assert!(why.contains("table allocator_rows is missing"), "{why}");
        // Version 4's view joins a column version 3 files do not have, and
        // a version 3 view would read version 4's left-out words as NULL;
        // version 5 stores a duration and a distance where version 4 stored
        // a start and an id.
        let why = check(&fresh_v3(), 4).expect("check").expect_err("refused");
        assert!(why.contains("base_id"), "{why}");
        let why = check(&fresh_v4(), 5).expect("check").expect_err("refused");
        assert!(why.contains("allocator_rows has no column dur_ns"), "{why}");
        let why = check(&fresh(), 4).expect("check").expect_err("refused");
        assert!(
            why.contains("allocator_rows has no column start_ns"),
            "{why}"
        );
        let not_ours = "allocator_events is a view that is not the view gpusleuth writes";
        let why = check(&fresh_v4(), 3).expect("check").expect_err("refused");
        assert!(why.contains(not_ours), "{why}");
        let why = {
            let c = fresh_v4();
            c.execute_batch(&format!("DROP VIEW allocator_events; {ALLOCATOR_VIEW_V3};"))
                .expect("v3 view");
            check(&c, 4).expect("check").expect_err("refused")
        };
        assert!(why.contains(not_ours), "{why}");
        let why = {
            let c = fresh_v5();
            c.execute_batch(&format!(
                "DROP VIEW allocator_events; ALTER TABLE allocator_rows ADD COLUMN start_ns INTEGER;
                 ALTER TABLE allocator_rows ADD COLUMN base_id INTEGER; {ALLOCATOR_VIEW_V4};"
            ))
            .expect("v4 view");
            check(&c, 5).expect("check").expect_err("refused")
        };
        assert!(why.contains(not_ours), "{why}");
        refused(
            fresh,
            SCHEMA_VERSION,
            &[
                (
                    "DROP VIEW allocator_events;
                     CREATE VIEW allocator_events AS SELECT * FROM allocator_rows",
                    "allocator_events is a view that is not the view gpusleuth writes",
                ),
                (
                    "DROP VIEW allocator_events",
                    "view allocator_events is missing",
                ),
            ],
        );
    }

    /// Each change of `cases` (SQL, what the refusal must name), applied to
    /// its own `fresh()` database, makes `check` at `version` refuse it.
    fn refused(fresh: fn() -> Connection, version: i64, cases: &[(&str, &str)]) {
        for (sql, names) in cases {
            let c = fresh();
            c.execute_batch(sql).expect("change the schema");
            let why = check(&c, version).expect("check").expect_err("refused");
            assert!(why.contains(names), "{sql}: {why}");
        }
    }

    #[test]
    fn our_partial_index_passes_and_a_changed_one_is_refused() {
        assert_eq!(check(&fresh(), SCHEMA_VERSION).expect("check"), Ok(()));
        refused(
            fresh,
            SCHEMA_VERSION,
            &[(
                "DROP INDEX call_rows_stack;
                 CREATE INDEX call_rows_stack ON call_rows(stack_id) WHERE length(printf('%.*c', 9, 'x')) > 0",
                "call_rows_stack on call_rows is a partial index",
            )],
        );
        refused(
            fresh_v1,
            1,
            &[(
                "DROP INDEX calls_stack;
                 CREATE INDEX calls_stack ON calls(stack_id) WHERE length(printf('%.*c', 9, 'x')) > 0",
                "calls_stack on calls is a partial index",
            )],
        );
    }

    /// Version 6's computed columns are SQL from the file that every read
    /// runs: a table is accepted with them only as gpusleuth writes it,
    /// and only in a version 6 file.
    #[test]
    fn computed_columns_only_as_written_and_only_in_version_6() {
        let why = check(&fresh(), 5).expect("check").expect_err("refused");
        assert_eq!(why, "call_rows.pid is a hidden or generated column");
        let why = check(&fresh_v5(), 6).expect("check").expect_err("refused");
        assert_eq!(why, "call_rows has no column pid_gap");
        for (table, changed) in [
            (
                "call_rows",
                create_v6("call_rows").replace("(tid - pid_gap)", "(tid - pid_gap + 0)"),
            ),
            (
                "waits",
                create_v6("waits").replace("max(runnable_for, 0)", "max(runnable_for, 1)"),
            ),
            (
                "waits",
                create_v6("waits").replace("ELSE 'unknown'", "ELSE 'blocked'"),
            ),
        ] {
            let c = fresh();
            let index = if table == "waits" {
                "CREATE INDEX waits_tid_on ON waits(tid, on_ns);"
            } else {
                ""
            };
            c.execute_batch(&format!("DROP TABLE {table}; {changed}; {index}"))
                .expect("changed");
            let why = check(&c, 6).expect("check").expect_err("refused");
            assert!(
                why.starts_with(&format!("{table}.")) && why.ends_with("not written by gpusleuth"),
                "{why}"
            );
        }
    }

    /// `call_rows` and `waits` as version 6 writes them, taken from a fresh file.
    fn create_v6(table: &str) -> String {
        table_sql(&fresh(), table).expect("sql").expect("table")
    }

    #[test]
    fn optional_table_may_be_absent() {
        let c = fresh();
        c.execute_batch("DROP TABLE gpu_samples").expect("drop");
        assert_eq!(check(&c, SCHEMA_VERSION).expect("check"), Ok(()));
        // Version 2's allocator events were optional (added after version 1).
        let c = fresh_v2();
        c.execute_batch("DROP TABLE allocator_events")
            .expect("drop");
        assert_eq!(check(&c, 2).expect("check"), Ok(()));
    }

    #[test]
    fn view_instead_of_table_is_refused() {
        refused(
            fresh_v1,
            1,
            &[(
                "DROP TABLE calls;
                 CREATE VIEW calls AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM r)
                 SELECT x AS id, x AS ts_ns FROM r",
                "calls is a view",
            )],
        );
        refused(
            fresh,
            SCHEMA_VERSION,
            &[(
                "DROP VIEW call_sites; DROP VIEW calls_wall; DROP VIEW op_summary;
                 DROP VIEW call_culprits_named; DROP VIEW calls; DROP TABLE call_rows;
                 CREATE VIEW call_rows AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM r)
                 SELECT x AS id, x AS ts_ns FROM r",
                "call_rows is a view",
            )],
        );
    }

    #[test]
    fn a_calls_view_other_than_ours_is_refused() {
        refused(
            fresh,
            SCHEMA_VERSION,
            &[
                // Same columns, but every read of it would never end.
                (
                    "DROP VIEW call_sites; DROP VIEW calls_wall; DROP VIEW op_summary;
                     DROP VIEW call_culprits_named; DROP VIEW calls;
                     CREATE VIEW calls AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM r)
                     SELECT c.* FROM call_rows c, r",
                    "not the view gpusleuth writes",
                ),
                (
                    "DROP VIEW call_sites; DROP VIEW calls_wall; DROP VIEW op_summary;
                     DROP VIEW call_culprits_named; DROP VIEW calls; CREATE TABLE calls(x)",
                    "not the view gpusleuth writes",
                ),
            ],
        );
    }

    #[test]
    fn long_op_names_are_refused() {
        refused(
            fresh,
            SCHEMA_VERSION,
            &[(
                "INSERT INTO ops(layer, op) VALUES ('runtime', printf('%.*c', 1000000, 'Z'))",
                "longer than",
            )],
        );
    }

    #[test]
    fn missing_or_retyped_columns_are_refused() {
        refused(
            fresh,
            SCHEMA_VERSION,
            &[
                (
                    "ALTER TABLE notes DROP COLUMN level",
                    "notes has no column level",
                ),
                (
                    "DROP TABLE stats; CREATE TABLE stats(name TEXT PRIMARY KEY, value TEXT)",
                    "stats.value",
                ),
            ],
        );
    }

    #[test]
    fn generated_columns_and_expression_indexes_are_refused() {
        refused(
            fresh,
            SCHEMA_VERSION,
            &[
                (
                    "ALTER TABLE notes ADD COLUMN g TEXT GENERATED ALWAYS AS (printf('%.*c', 1000, 'x')) VIRTUAL",
                    "generated",
                ),
                ("CREATE INDEX evil ON call_rows(abs(dur_ns))", "expression"),
                (
                    "CREATE INDEX part ON call_rows(pid) WHERE dur_ns > 0",
                    "partial",
                ),
            ],
        );
    }
}
