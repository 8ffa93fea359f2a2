#!/usr/bin/env bash
# Instructions per HTTP publish: `herald bench publish --publishers 64`
# (an Idempotency-Key on every publish, `chat:` channels, fsync = always,
# bench/herald.toml) against a server under valgrind --tool=callgrind, run
# with 2,000 and with 10,000 publishes; per publish = the difference of
# the two totals / 8,000 (start, connections and shutdown cancel out).
#
#   bench/callgrind-publish.sh [--herald PATH] [--out DIR] [--port PORT]
#
# Every bench run still verifies its publishes (seqs, log heads, replays).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERALD=$ROOT/target/release/herald
OUT=
PORT=18797
while [ $# -gt 0 ]; do
  case $1 in
    --herald) HERALD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$ROOT/bench/callgrind-publish.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$ROOT/bench/results/callgrind-publish-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
for n in 2000 10000; do
  D=$(mktemp -d /tmp/herald-callgrind-publish.XXXXXX)
  HERALD_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$OUT/publish-$n.callgrind" "$HERALD" serve --dev \
    --config "$ROOT/bench/herald.toml" --data-dir "$D/data" --listen "127.0.0.1:$PORT" >"$OUT/server-$n.log" 2>&1 &
  VP=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
  "$HERALD" bench publish --target "http://127.0.0.1:$PORT" --dev --publishers 64 --messages "$n" --size 100 \
    --timeout 900s --json "$OUT/results.jsonl" >"$OUT/bench-$n.log" 2>&1 || echo "   !! the bench failed (see $OUT/bench-$n.log)" >&2
  kill -TERM "$VP"
  wait "$VP"
  rm -rf "$D"
done
a=$(awk '/^(totals|summary):/ { print $2; exit }' "$OUT/publish-2000.callgrind")
b=$(awk '/^(totals|summary):/ { print $2; exit }' "$OUT/publish-10000.callgrind")
echo "instructions per HTTP publish: $(( (b - a) / 8000 )) (Ir $a / $b)" | tee "$OUT/summary.txt"
callgrind_annotate --inclusive=no "$OUT/publish-10000.callgrind" 2>/dev/null | head -60 >"$OUT/publish-10000.top.txt" || true
echo "results: $OUT"
