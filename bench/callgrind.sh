#!/usr/bin/env bash
# Count Herald's instructions per publish and per delivery with callgrind
# (`perf stat -e instructions` is not supported on this machine's virtual
# CPUs; callgrind counts instructions exactly, at ~50× the run time).
#
#   bench/callgrind.sh [--namespaces "chat live"] [--p2p "1000 10000"] [--p2p-users 1]
#                      [--fanout "100 1000"] [--subs 200] [--fanout-rate max] [--reps 1]
#                      [--wire herald|centrifugo-json|centrifugo-protobuf] [--out DIR] [--herald PATH]
#
# The binary: --herald, else $HERALD, else target/profiling/herald (the
# release build with debug info: cargo build --profile profiling -p herald).
#
# For each namespace, four fresh servers run under
# `valgrind --tool=callgrind`, each taking one fixed workload from
# `herald bench` (which runs natively, with one pipelined WebSocket
# publisher, --publish-via ws):
#
#   p2p A, p2p B   --p2p-users subscribers (default 1), each on its own
#                  channel, N_A and N_B publishes round-robin to them
#   fan A, fan B   --subs subscribers on one channel, F_A and F_B messages,
#                  back to back (--fanout-rate max), or paced at
#                  --fanout-rate messages/s: then every delivery wakes its
#                  session on its own, as in the hot-paths table's paced
#                  fan-out row (e.g. --fanout "20 60" --fanout-rate 5: each
#                  message is out to every subscriber before the next one,
#                  even under valgrind)
#
# Each server's total instructions (Ir) include its start, the connections
# and the shutdown; the differences between the A and B runs cancel them:
#
#   per publish with one delivery  P = (Ir p2p B − Ir p2p A) / (N_B − N_A)
#   per message fanned out to S    F = (Ir fan B − Ir fan A) / (F_B − F_A)
#   per delivery                   D = (F − P) / (S − 1)
#   per publish (without delivery)     P − D
#
# --wire: the subscribers' wire (`herald bench --wire`): Herald's own
# (`/ws`, the default) or the Centrifugo endpoint's JSON or Protobuf wire; the
# publisher is the same pipelined `/ws` connection either way.
#
# Keep N_B / --p2p-users within the namespace's `history_size` (10,000 on
# the default `chat`): beyond it every append also trims the channel's
# oldest entry, and the count measures the trim as well. Many users
# (--p2p-users 200) make each publish wake its own session, as in the
# hot-paths table's p2p row.
#
# With --reps N every workload runs N times and its median count is used.
# Every bench run still verifies its deliveries. Results, the callgrind
# files and a per-function profile of each p2p B run (callgrind_annotate)
# go to DIR (default bench/results/callgrind-<time>). Counts move between
# runs: threads that wake, spin or park depend on timing (the storage
# engine's group commit above all), and D is a difference of two
# differences; many subscribers (--subs) keep its share small. Compare
# figures from the same script and sizes, not to the percent.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
HERALD_BUILD=profiling . bench/lib.sh

NAMESPACES="chat live"
P2P="1000 10000"
P2P_USERS=1
FANOUT="100 1000"
FANOUT_RATE=max
SUBS=200
REPS=1
WIRE=herald
OUT=
# A free port unless one is given: two runs at once (two worktrees) must
# not bench each other's server.
PORT=${CALLGRIND_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
while [ $# -gt 0 ]; do
  case $1 in
    --namespaces) NAMESPACES=$2; shift 2 ;;
    --p2p) P2P=$2; shift 2 ;;
    --p2p-users) P2P_USERS=$2; shift 2 ;;
    --fanout) FANOUT=$2; shift 2 ;;
    --subs) SUBS=$2; shift 2 ;;
    --fanout-rate) FANOUT_RATE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --wire) WIRE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --herald) HERALD=$2; shift 2 ;;
    -h|--help) sed -n '2,53p' "$ROOT/bench/callgrind.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
require_herald
read -r N_A N_B <<<"$P2P"
read -r F_A F_B <<<"$FANOUT"
if [ "$N_B" -le "$N_A" ] || [ "$F_B" -le "$F_A" ] || [ "$SUBS" -lt 2 ]; then
  echo "need N_A < N_B, F_A < F_B and --subs of at least 2" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/bench/results/callgrind-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
mkdir -p "$OUT/bin"
cp "$HERALD" "$OUT/bin/herald"
HERALD=$OUT/bin/herald
LOG=$OUT/run.log

trap 'stop_callgrind_herald' EXIT
trap 'stop_callgrind_herald; exit 130' INT TERM

# run NAME SCENARIO BENCH-ARGS...: one server under callgrind, one bench
# run against it; sets IR to the server's total instructions.
# The server's settings: bench/herald.toml (which ends in its [websocket]
# table) plus outboxes deep enough for every run to deliver everything. A
# server under valgrind runs ~50x slower, and one subscriber taking a
# whole p2p run can fall behind its publisher: on `live:` (volatile) a
# full outbox drops messages by design, which the bench counts as lost.
CONFIG=$OUT/herald.toml
if [ "$(grep -E '^\[' "$ROOT/bench/herald.toml" | tail -1)" != "[websocket]" ]; then
  echo "bench/herald.toml no longer ends in its [websocket] table: update $0" >&2
  exit 2
fi
{
  cat "$ROOT/bench/herald.toml"
  printf '\n# bench/callgrind.sh: deep outboxes (see the script)\noutbox_capacity = 65536\noutbox_bytes = 67108864\n'
} >"$CONFIG"

IR=
run() {
  local name=$1
  shift
  start_callgrind_herald "$OUT/$name.callgrind" "$CONFIG" "$PORT" "$OUT/$name.server.log" || return 1
  if ! "$HERALD" bench "$@" --target "http://127.0.0.1:$PORT" --dev --publish-via ws --wire "$WIRE" --timeout 900s \
      --label "$name" --json "$OUT/results.jsonl" >>"$LOG" 2>&1; then
    echo "   !! $name: the bench failed (see $LOG)" >&2
    stop_callgrind_herald
    return 1
  fi
  stop_callgrind_herald
  # `totals:` (or `summary:`) is the Ir over every thread.
  IR=$(callgrind_total "$OUT/$name.callgrind")
  [ -n "$IR" ] || { echo "   !! $name: no instruction count in $OUT/$name.callgrind" >&2; return 1; }
}

# median_run NAME ARGS...: `run` --reps times (NAME-1, NAME-2, …; the last
# one keeps NAME for the profile); IR is the median count.
median_run() {
  local name=$1 k counts=()
  shift
  for k in $(seq 1 "$REPS"); do
    if [ "$k" = "$REPS" ]; then run "$name" "$@" || return 1; else run "$name-$k" "$@" || return 1; fi
    counts+=("$IR")
  done
  IR=$(printf '%s\n' "${counts[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "%.0f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  [ "$REPS" = 1 ] || echo "   $name: ${counts[*]} → median $IR" >>"$LOG"
}

per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.0f", (b - a) / n }'; }

status=0
{
  echo "| namespace | per publish + 1 delivery | per message to $SUBS subscribers | per delivery | per publish (no delivery) |"
  echo "|---|---|---|---|---|"
} >"$OUT/summary.md"
for ns in $NAMESPACES; do
  echo "== $ns: p2p $N_A and $N_B publishes to $P2P_USERS subscriber(s), fan-out $F_A and $F_B messages to $SUBS (rate $FANOUT_RATE)" | tee -a "$LOG"
  median_run "$ns-p2p-$N_A" p2p --namespace "$ns" --connections "$P2P_USERS" --messages "$N_A" || { status=1; continue; }
  pa=$IR
  median_run "$ns-p2p-$N_B" p2p --namespace "$ns" --connections "$P2P_USERS" --messages "$N_B" || { status=1; continue; }
  pb=$IR
  median_run "$ns-fanout-$F_A" fanout --namespace "$ns" --connections "$SUBS" --messages "$F_A" --rate "$FANOUT_RATE" \
    || { status=1; continue; }
  fa=$IR
  median_run "$ns-fanout-$F_B" fanout --namespace "$ns" --connections "$SUBS" --messages "$F_B" --rate "$FANOUT_RATE" \
    || { status=1; continue; }
  fb=$IR
  echo "   Ir: p2p $pa / $pb, fan-out $fa / $fb" | tee -a "$LOG"
  p=$(per "$pa" "$pb" $((N_B - N_A)))
  f=$(per "$fa" "$fb" $((F_B - F_A)))
  d=$(per "$p" "$f" $((SUBS - 1)))
  pub=$((p - d))
  echo "   $ns: $p instructions per publish with one delivery; $d per delivery; $pub per publish without delivery" | tee -a "$LOG"
  echo "| \`$ns:\` | $p | $f | $d | $pub |" >>"$OUT/summary.md"
  callgrind_annotate --inclusive=no "$OUT/$ns-p2p-$N_B.callgrind" 2>/dev/null | head -60 >"$OUT/$ns-p2p-$N_B.top.txt" || true
done
echo
cat "$OUT/summary.md"
echo
echo "results: $OUT (summary.md, *.callgrind, *.top.txt, run.log)"
exit $status
