#!/usr/bin/env bash
# Run Herald and the peer servers in turn (A B C … A B C …), several
# repetitions, each run against a freshly started server, and print a
# table of medians with Herald/peer ratios (bench/table.py).
#
#   bench/run.sh [--reps N] [--servers "herald ws socketio socketioxide nats"]
#                [--scenarios "idle fanout p2p publish reconnect acked"] [--out DIR] [--quick]
#                [--no-build]
#
# The herald binary is copied into DIR/bin first and used from there (for
# the server and the bench), so a rebuild during the run changes nothing.
# --no-build skips bench/setup.sh and uses the binary as it is.
#
# Sizes come from the environment (defaults: the figures in
# docs/benchmarks.md): IDLE_CONNS, IDLE_HOLD, FANOUT_SUBS, FANOUT_MESSAGES,
# FANOUT_RATE, P2P_USERS, P2P_MESSAGES, PUBLISHERS, PUBLISH_MESSAGES,
# RECONNECT_CLIENTS, ACKED_USERS, ACKED_MESSAGES (per user and phase), and
# NAMESPACE (of the per-user channels of idle and p2p; default `user`;
# acked always runs on `user`). `--quick` shrinks them for a smoke run.
#
# `reconnect` and `acked` run against Herald only: the peers have no resume,
# so a dropped client loses what was published meanwhile by design, and no
# acked delivery.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=3
SERVERS="herald ws socketio socketioxide nats"
SCENARIOS="idle fanout p2p publish reconnect acked"
OUT=
BUILD=1
while [ $# -gt 0 ]; do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --quick)
      : "${IDLE_CONNS:=2000}" "${IDLE_HOLD:=5s}" "${FANOUT_SUBS:=500}" "${FANOUT_MESSAGES:=50}"
      : "${P2P_USERS:=200}" "${P2P_MESSAGES:=2000}" "${PUBLISH_MESSAGES:=2000}" "${RECONNECT_CLIENTS:=100}"
      : "${ACKED_USERS:=200}" "${ACKED_MESSAGES:=20}"
      shift ;;
    -h|--help) sed -n '2,23p' "$ROOT/bench/run.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
IDLE_CONNS=${IDLE_CONNS:-15000}
IDLE_HOLD=${IDLE_HOLD:-30s}
FANOUT_SUBS=${FANOUT_SUBS:-5000}
FANOUT_MESSAGES=${FANOUT_MESSAGES:-200}
FANOUT_RATE=${FANOUT_RATE:-20,max}
P2P_USERS=${P2P_USERS:-1000}
P2P_MESSAGES=${P2P_MESSAGES:-20000}
PUBLISHERS=${PUBLISHERS:-64}
PUBLISH_MESSAGES=${PUBLISH_MESSAGES:-20000}
RECONNECT_CLIENTS=${RECONNECT_CLIENTS:-1000}
ACKED_USERS=${ACKED_USERS:-1000}
ACKED_MESSAGES=${ACKED_MESSAGES:-50}
NAMESPACE=${NAMESPACE:-user}

OUT=${OUT:-$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
JSON=$OUT/results.jsonl
LOG=$OUT/run.log

if [ "$BUILD" = 1 ]; then
  # shellcheck disable=SC2086
  bash "$ROOT/bench/setup.sh" $SERVERS >>"$LOG" 2>&1 || { echo "setup failed, see $LOG" >&2; exit 1; }
fi
mkdir -p "$OUT/bin"
cp "$HERALD" "$OUT/bin/herald" || { echo "no herald binary at $HERALD (run bench/setup.sh)" >&2; exit 1; }
HERALD=$OUT/bin/herald

trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

scenario_args() {
  case $1 in
    idle) echo "--connections $IDLE_CONNS --hold $IDLE_HOLD --namespace $NAMESPACE" ;;
    fanout) echo "--connections $FANOUT_SUBS --messages $FANOUT_MESSAGES --rate $FANOUT_RATE" ;;
    p2p) echo "--connections $P2P_USERS --messages $P2P_MESSAGES --namespace $NAMESPACE" ;;
    publish) echo "--publishers $PUBLISHERS --messages $PUBLISH_MESSAGES" ;;
    reconnect) echo "--connections $RECONNECT_CLIENTS" ;;
    acked) echo "--connections $ACKED_USERS --messages $ACKED_MESSAGES --namespace user" ;;
  esac
}

failures=0
for rep in $(seq 1 "$REPS"); do
  for scenario in $SCENARIOS; do
    for server in $SERVERS; do
      case $scenario in
        reconnect|acked) if [ "$server" != herald ]; then continue; fi ;;
      esac
      echo "== rep $rep/$REPS  $scenario  $server" | tee -a "$LOG"
      if ! start_server "$server" >>"$LOG" 2>&1; then
        echo "   !! $server did not start (see $LOG)" | tee -a "$LOG"
        stop_server
        failures=$((failures + 1))
        continue
      fi
      # pipefail: the pipeline fails when the bench does.
      # shellcheck disable=SC2046
      if ! "$HERALD" bench "$scenario" --target "$TARGET" "${PEER_ARGS[@]}" --server-pid "$SERVER_PID" \
          --label "rep=$rep" --json "$JSON" $(scenario_args "$scenario") 2>&1 | tee -a "$LOG"; then
        failures=$((failures + 1))
      fi
      stop_server
      sleep 1
    done
  done
done

echo
python3 "$ROOT/bench/table.py" "$JSON" | tee "$OUT/table.md"
echo
echo "results: $JSON  log: $LOG  table: $OUT/table.md"
if [ "$failures" -gt 0 ]; then
  echo "!! $failures run(s) failed verification or did not run; see $LOG" >&2
  exit 1
fi
