#!/usr/bin/env bash
# The Redis engine's figures: publishes/s and fan-out deliveries/s through
# one Herald node and through two nodes on one Redis, and publish -> deliver
# latency across nodes (subscribers on node A, publisher on node B), next to
# the embedded engine on the same machine in the same run.
#
#   bench/redis.sh [--out DIR] [--herald PATH]
#
# Starts its own redis-server (AOF, appendfsync always) on a free port in a
# temp dir and its own Herald nodes; stops everything at the end. Every
# bench run is bounded (--messages, --timeout). Sizes from the environment:
# PUBLISH_MESSAGES (20000), PUBLISHERS (64), FANOUT_SUBS (1000),
# FANOUT_MESSAGES (300), FANOUT_RATE (100,max), APPENDFSYNC (always).
set -euo pipefail
cd "$(dirname "$0")/.."
HERALD=${HERALD:-target/release/herald}
OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --herald) HERALD=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 64 ;;
  esac
done
OUT=${OUT:-bench/results/redis-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
JSON="$OUT/results.jsonl"
PUBLISH_MESSAGES=${PUBLISH_MESSAGES:-20000}
PUBLISHERS=${PUBLISHERS:-64}
FANOUT_SUBS=${FANOUT_SUBS:-1000}
FANOUT_MESSAGES=${FANOUT_MESSAGES:-300}
FANOUT_RATE=${FANOUT_RATE:-100,max}
APPENDFSYNC=${APPENDFSYNC:-always}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {
  for _ in $(seq 1 200); do
    curl -sf "http://$1/readyz" >/dev/null && return 0
    sleep 0.05
  done
  echo "node $1 not ready" >&2; exit 1
}

RPORT=$(free_port)
mkdir -p "$TMP/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$TMP/redis" --save '' \
  --appendonly yes --appendfsync "$APPENDFSYNC" >"$OUT/redis.log" 2>&1 &
PIDS+=($!)
REDIS_PID=$!
for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
URL="redis://127.0.0.1:$RPORT"

start_node() { # name listen extra-args...
  local name=$1 listen=$2; shift 2
  HERALD_LOG=warn "$HERALD" serve --dev --listen "$listen" "$@" >"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  wait_ready "$listen"
}
bench() { # label args...
  local label=$1; shift
  echo "== $label"
  "$HERALD" bench "$@" --dev --json "$JSON" --label "$label" --timeout 120s
}

# Embedded engine, for comparison.
EP=127.0.0.1:$(free_port)
start_node embedded "$EP" --data-dir "$TMP/embedded"
EMB_PID=${PIDS[-1]}
bench embedded-publish publish --target "http://$EP" --messages "$PUBLISH_MESSAGES" --publishers "$PUBLISHERS" --server-pid "$EMB_PID"
bench embedded-fanout fanout --target "http://$EP" --connections "$FANOUT_SUBS" --messages "$FANOUT_MESSAGES" --rate "$FANOUT_RATE" --server-pid "$EMB_PID"
kill "$EMB_PID"; wait "$EMB_PID" 2>/dev/null || true

A=127.0.0.1:$(free_port)
B=127.0.0.1:$(free_port)
start_node node-a "$A" --engine redis --redis-url "$URL"
A_PID=${PIDS[-1]}
start_node node-b "$B" --engine redis --redis-url "$URL"

bench redis-1node-publish publish --target "http://$A" --messages "$PUBLISH_MESSAGES" --publishers "$PUBLISHERS" --server-pid "$A_PID"
# Two nodes at once, half the publishers and messages each: the sum is the
# two-node rate (both processes print their own figures).
half=$((PUBLISH_MESSAGES / 2)); halfp=$((PUBLISHERS / 2))
bench redis-2node-publish-a publish --target "http://$A" --messages "$half" --publishers "$halfp" &
p1=$!
bench redis-2node-publish-b publish --target "http://$B" --messages "$half" --publishers "$halfp" &
p2=$!
wait "$p1" "$p2"

bench redis-1node-fanout fanout --target "http://$A" --connections "$FANOUT_SUBS" --messages "$FANOUT_MESSAGES" --rate "$FANOUT_RATE" --server-pid "$A_PID"
bench redis-cross-node-fanout fanout --target "http://$A" --publish-target "http://$B" --connections "$FANOUT_SUBS" --messages "$FANOUT_MESSAGES" --rate "$FANOUT_RATE" --server-pid "$A_PID"

echo "redis-server CPU (utime+stime, s): $(awk '{print ($14+$15)/100}' "/proc/$REDIS_PID/stat")"
echo "results: $JSON"
