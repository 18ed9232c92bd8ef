-- What a tracer's completion adds to a trace file (issue 16, round 48):
-- taken away, a trace written by this build is as its tracer leaves it when
-- killed before completing it (checked against a real killed tracer's file:
-- the same tables, indexes and meta keys; rows only in the writer's tables).
-- Used by tests/hostile_traces.rs and scripts/finish_bench.sh.
DROP INDEX IF EXISTS call_rows_op_dur; DROP INDEX IF EXISTS call_rows_tid_ts;
DROP TABLE IF EXISTS allocator_checkpoints; DROP TABLE IF EXISTS allocator_rollup; DROP TABLE IF EXISTS call_groups;
DROP TABLE IF EXISTS finding_hist; DROP TABLE IF EXISTS finding_op_hist; DROP TABLE IF EXISTS finding_op_threads;
DROP TABLE IF EXISTS finding_ops; DROP TABLE IF EXISTS finding_process_ops; DROP TABLE IF EXISTS finding_spans;
DROP TABLE IF EXISTS finding_threads; DROP TABLE IF EXISTS ledger_rollup; DROP TABLE IF EXISTS site_calls;
DROP TABLE IF EXISTS site_memory; DROP TABLE IF EXISTS wait_ends; DROP TABLE IF EXISTS wait_groups;
DELETE FROM meta WHERE key NOT IN ('schema_version', 'tool', 'source', 'tool_version', 'clock_base_ns');
DELETE FROM call_culprits; DELETE FROM rollup_ops; DELETE FROM rollup_hist;
DELETE FROM rollup_culprits; DELETE FROM rollup_threads;
DELETE FROM stats WHERE name = 'tracer_cpu_ns_completion';
