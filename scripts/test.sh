#!/usr/bin/env bash
# The README's test command: `cargo test --workspace --no-fail-fast`
# (arguments are passed on), then the list of tests that did not run and why. cargo hides what a
# passing test prints, so a test that skips (no root for eBPF, no Chromium,
# no Python `mcp` package, ...) also writes a line to $GPUSLEUTH_SKIP_LOG
# (crates/gpusleuth/tests/common/skip.rs); this script collects them.
# With CI=true a skip fails the run: in CI every test must run.
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp "${TMPDIR:-/tmp}/gpusleuth-skips.XXXXXX")
trap 'rm -f "$log"' EXIT
# --no-fail-fast: a failing test binary must not hide which tests after it
# would have run or skipped.
GPUSLEUTH_SKIP_LOG="$log" cargo test --workspace --no-fail-fast "$@"
rc=$?

echo
if [ -s "$log" ]; then
    n=$(wc -l <"$log")
    echo "== $n test(s) did not run:"
    sort "$log" | sed 's/^/   SKIPPED /'
    if [ "${CI:-}" = "true" ]; then
        echo "== CI=true: every test must run here"
        [ "$rc" -eq 0 ] && rc=1
    fi
else
    echo "== every test ran (none skipped)"
fi
exit "$rc"
