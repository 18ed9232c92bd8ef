#!/usr/bin/env bash
# Issue 16, round 27: what real PyTorch `Block` words look like (the 16
# words `trace --torch-allocator` stores per allocator event, 128 of the
# row's ~195 bytes), to size a packed encoding on real data. Traces the
# seed's generate/del/empty_cache rounds (scripts/gpu/allocator_check.py)
# and dumps 4,000 allocator events of each trace (the first 2,000 and 2,000
# spread over the rest) as text: op, block, requested, the words in hex.
# Usage (device, repo root, the build carried as target/release/gpusleuth):
#   OUT=$OUT bash scripts/gpu/round27_words.sh target/release/gpusleuth
set -u
. scripts/gpu/device_env.sh "$1"
timeout 240 "$PY" scripts/gpu/allocator_check.py --gs "$GS" --py "$PY" --out "$OUT/alloc" >"$OUT/allocator.log" 2>&1
echo "allocator_check rc=$?"; grep -E "RESULT" "$OUT/allocator.log"
for mode in default expandable; do
  "$PY" - "/tmp/alloc_$mode.db" "$OUT/words_$mode.txt" <<'PY'
import sqlite3, struct, sys
db, out = sys.argv[1:3]
c = sqlite3.connect(db)
n = c.execute("SELECT count(*) FROM allocator_events").fetchone()[0]
step = max(1, (n - 2000) // 2000)
cols = [r[1] for r in c.execute("PRAGMA table_info(allocator_events)")]
# Version 2 (this script's first run): one BLOB; version 3: w0..w15.
words = "words" if "words" in cols else ", ".join(f"w{i}" for i in range(16))
rows = c.execute(
    f"SELECT id, op, block, requested, {words} FROM allocator_events "
    "WHERE id <= 2000 OR (id > 2000 AND (id - 2000) % ? = 0) ORDER BY id", (step,)).fetchall()
with open(out, "w") as f:
    f.write(f"# {db}: {n} allocator events; id op block requested words(hex, 16 little-endian u64)\n")
    for r in rows:
        w = r[4].hex().upper() if words == "words" else struct.pack("<16q", *r[4:]).hex().upper()
        f.write(" ".join(str(x) for x in r[:4]) + " " + w + "\n")
print(out, len(rows), "rows of", n)
PY
done
