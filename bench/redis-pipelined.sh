#!/usr/bin/env bash
# Pipelined publishing on the Redis engine: one or more herald binaries
# side by side (before/after), each against a private redis-server.
#
#   bench/redis-pipelined.sh [--herald PATH]... [--reps N] [--users U] [--messages M]
#                  [--namespace chat|live] [--callgrind] [--out DIR]
#
# Starts its own redis-server (AOF, `appendfsync always`, no RDB) on a free
# port in a temp dir, flushed before every run. For each repetition and
# each binary in turn (A B A B …): `herald serve --engine redis` with
# bench/herald.toml, then `herald bench p2p --publish-via ws`: U users
# (default 1,000), M publishes of 100 B round-robin to them (default
# 20,000) from one pipelined WebSocket connection (window 1,000). Prints
# deliveries/s per run, Redis's CPU seconds per run (from /proc) and with
# --callgrind the server's instructions per publish (the run under
# valgrind --tool=callgrind, minus a run with a tenth of the messages,
# divided by the difference). Defaults: the release binary of this tree
# (the one timed; --herald target/profiling/herald for line-level profiles).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERALDS=()
REPS=2
USERS=1000
MESSAGES=20000
NS=chat
CALLGRIND=0
OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --herald) HERALDS+=("$2"); shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --users) USERS=$2; shift 2 ;;
    --messages) MESSAGES=$2; shift 2 ;;
    --namespace) NS=$2; shift 2 ;;
    --callgrind) CALLGRIND=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$ROOT/bench/redis-pipelined.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
[ ${#HERALDS[@]} -gt 0 ] || HERALDS=("$ROOT/target/release/herald")
command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 1; }
OUT=${OUT:-$ROOT/bench/results/redis-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/bin"
LOG=$OUT/run.log
for k in "${!HERALDS[@]}"; do
  cp "${HERALDS[$k]}" "$OUT/bin/herald-$k"
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RDIR=$(mktemp -d /tmp/herald-redis-bench.XXXXXX)
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$RDIR" --appendonly yes --appendfsync always \
  --save '' --daemonize no >"$OUT/redis.log" 2>&1 &
RPID=$!
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  kill -9 "$RPID" 2>/dev/null
  wait "$RPID" 2>/dev/null
  rm -rf "$RDIR"
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_cpu() { awk '{ print $14 + $15 }' "/proc/$RPID/stat"; }
HZ=$(getconf CLK_TCK)
PORT=$(free_port)

# run BIN LABEL MESSAGES [callgrind-out]: one server, one bench run; prints
# deliveries/s and Redis CPU s; with callgrind-out, the server runs under
# callgrind and IR is its total count.
IR=
run() {
  local bin=$1 label=$2 n=$3 cg=${4:-} i before after dps
  redis-cli -p "$RPORT" flushall >/dev/null
  local pre=()
  [ -n "$cg" ] && pre=(valgrind --tool=callgrind --callgrind-out-file="$cg")
  HERALD_LOG=warn "${pre[@]}" "$bin" serve --dev --config "$ROOT/bench/herald.toml" --engine redis \
    --redis-url "redis://127.0.0.1:$RPORT" --listen "127.0.0.1:$PORT" >>"$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  for i in $(seq 1 1200); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  before=$(redis_cpu)
  if ! "$bin" bench p2p --target "http://127.0.0.1:$PORT" --dev --publish-via ws --namespace "$NS" \
      --connections "$USERS" --messages "$n" --size 100 --timeout 900s --server-pid "$SERVER_PID" \
      --label "$label" --json "$OUT/results.jsonl" >>"$LOG" 2>&1; then
    echo "   !! $label: the bench failed (see $LOG)" >&2
  fi
  after=$(redis_cpu)
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
  dps=$(tail -1 "$OUT/results.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r.get("deliveries_per_s",0)), "ok" if r.get("ok") else "FAILED")')
  echo "$label: $n publishes to $USERS users: $dps deliveries/s; redis CPU $(awk -v a="$before" -v b="$after" -v hz="$HZ" 'BEGIN { printf "%.2f", (b - a) / hz }') s" | tee -a "$OUT/summary.txt"
  if [ -n "$cg" ]; then IR=$(awk '/^(totals|summary):/ { print $2; exit }' "$cg"); fi
}

for r in $(seq 1 "$REPS"); do
  for k in "${!HERALDS[@]}"; do
    run "$OUT/bin/herald-$k" "herald-$k-rep$r" "$MESSAGES"
  done
done
if [ "$CALLGRIND" = 1 ]; then
  small=$((MESSAGES / 10))
  for k in "${!HERALDS[@]}"; do
    run "$OUT/bin/herald-$k" "herald-$k-cg-small" "$small" "$OUT/herald-$k-small.callgrind"; a=$IR
    run "$OUT/bin/herald-$k" "herald-$k-cg-big" "$MESSAGES" "$OUT/herald-$k-big.callgrind"; b=$IR
    echo "herald-$k: instructions per publish with its delivery: $(( (b - a) / (MESSAGES - small) )) (Ir $a / $b)" | tee -a "$OUT/summary.txt"
  done
fi
echo "results: $OUT"
