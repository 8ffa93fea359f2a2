#!/usr/bin/env bash
# Instructions per HTTP publish: `herald bench publish --publishers 64`
# (an Idempotency-Key on every publish, `chat:` channels, fsync = always,
# bench/herald.toml) against a server under valgrind --tool=callgrind, run
# with 2,000 and with 10,000 publishes; per publish = the difference of
# the two totals / 8,000 (start, connections and shutdown cancel out).
#
#   bench/callgrind-publish.sh [--herald PATH] [--out DIR] [--port PORT]
#
# The binary: --herald, else $HERALD, else target/profiling/herald (the
# release build with debug info: cargo build --profile profiling -p herald).
#
# Every bench run still verifies its publishes (seqs, log heads, replays).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
HERALD_BUILD=profiling . bench/lib.sh
callgrind_script publish 18797 "$@"
for n in 2000 10000; do
  start_callgrind_herald "$OUT/publish-$n.callgrind" "$ROOT/bench/herald.toml" "$PORT" "$OUT/server-$n.log"
  "$HERALD" bench publish --target "http://127.0.0.1:$PORT" --dev --publishers 64 --messages "$n" --size 100 \
    --timeout 900s --json "$OUT/results.jsonl" >"$OUT/bench-$n.log" 2>&1 || echo "   !! the bench failed (see $OUT/bench-$n.log)" >&2
  stop_callgrind_herald
done
a=$(callgrind_total "$OUT/publish-2000.callgrind")
b=$(callgrind_total "$OUT/publish-10000.callgrind")
echo "instructions per HTTP publish: $(( (b - a) / 8000 )) (Ir $a / $b)" | tee "$OUT/summary.txt"
callgrind_annotate --inclusive=no "$OUT/publish-10000.callgrind" 2>/dev/null | head -60 >"$OUT/publish-10000.top.txt" || true
echo "results: $OUT"
