#!/usr/bin/env bash
# Instructions per ping and pong of an idle connection: `herald bench idle
# --connections 1000` (each on its own `chat:` channel) held 10 s and 20 s
# against a server under valgrind --tool=callgrind with
# `heartbeat.ping_interval = "1s"` (bench/herald.toml otherwise); per ping =
# the difference of the two totals / (1,000 connections × 10 s).
#
#   bench/callgrind-idle.sh [--herald PATH] [--out DIR] [--port PORT]
#
# The binary: --herald, else $HERALD, else target/profiling/herald (the
# release build with debug info: cargo build --profile profiling -p herald).
#
# Each bench run still verifies that every connection stayed open.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
HERALD_BUILD=profiling . bench/lib.sh
callgrind_script idle 18798 "$@"
CONNS=1000
# bench/herald.toml with a 1 s ping (and the idle timeout above it).
{
  cat "$ROOT/bench/herald.toml"
  printf '\n[heartbeat]\nping_interval = "1s"\nidle_timeout = "30s"\n'
} >"$OUT/herald.toml"
for hold in 10 20; do
  start_callgrind_herald "$OUT/idle-$hold.callgrind" "$OUT/herald.toml" "$PORT" "$OUT/server-$hold.log"
  "$HERALD" bench idle --target "http://127.0.0.1:$PORT" --dev --connections "$CONNS" --hold "${hold}s" \
    --namespace chat >"$OUT/bench-$hold.log" 2>&1 || echo "   !! the bench failed (see $OUT/bench-$hold.log)" >&2
  stop_callgrind_herald
done
a=$(callgrind_total "$OUT/idle-10.callgrind")
b=$(callgrind_total "$OUT/idle-20.callgrind")
echo "instructions per ping and pong: $(( (b - a) / (CONNS * 10) )) (Ir $a / $b)" | tee "$OUT/summary.txt"
echo "results: $OUT"
