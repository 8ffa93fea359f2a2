#!/usr/bin/env bash
# Instructions per ping and pong of an idle connection: `herald bench idle
# --connections 1000` (each on its own `chat:` channel) held 10 s and 20 s
# against a server under valgrind --tool=callgrind with
# `limits.ping_interval = "1s"` (bench/herald.toml otherwise); per ping =
# the difference of the two totals / (1,000 connections × 10 s).
#
#   bench/callgrind-idle.sh [--herald PATH] [--out DIR] [--port PORT]
#
# Each bench run still verifies that every connection stayed open.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERALD=$ROOT/target/release/herald
OUT=
PORT=18798
CONNS=1000
while [ $# -gt 0 ]; do
  case $1 in
    --herald) HERALD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$ROOT/bench/callgrind-idle.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$ROOT/bench/results/callgrind-idle-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
# bench/herald.toml with a 1 s ping (and the idle timeout above it).
sed 's/^\[limits\]$/[limits]\nping_interval = "1s"\nidle_timeout = "30s"/' "$ROOT/bench/herald.toml" >"$OUT/herald.toml"
for hold in 10 20; do
  D=$(mktemp -d /tmp/herald-callgrind-idle.XXXXXX)
  HERALD_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$OUT/idle-$hold.callgrind" "$HERALD" serve --dev \
    --config "$OUT/herald.toml" --data-dir "$D/data" --listen "127.0.0.1:$PORT" >"$OUT/server-$hold.log" 2>&1 &
  VP=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
  "$HERALD" bench idle --target "http://127.0.0.1:$PORT" --dev --connections "$CONNS" --hold "${hold}s" \
    --namespace chat >"$OUT/bench-$hold.log" 2>&1 || echo "   !! the bench failed (see $OUT/bench-$hold.log)" >&2
  kill -TERM "$VP"
  wait "$VP"
  rm -rf "$D"
done
a=$(awk '/^(totals|summary):/ { print $2; exit }' "$OUT/idle-10.callgrind")
b=$(awk '/^(totals|summary):/ { print $2; exit }' "$OUT/idle-20.callgrind")
echo "instructions per ping and pong: $(( (b - a) / (CONNS * 10) )) (Ir $a / $b)" | tee "$OUT/summary.txt"
echo "results: $OUT"
