#!/usr/bin/env bash
# Run Herald and the peer servers in turn (A B C … A B C …), several
# repetitions, each run against a freshly started server, and print a
# table of medians (bench/table.py).
#
#   bench/run.sh [--suite hot|compare] [--reps N] [--servers "..."] [--scenarios "..."]
#                [--out DIR] [--quick] [--no-build]
#
# --suite hot (the default): the hot-paths table (docs/benchmarks.md):
#   servers "herald-chat herald-live nats ws" (Herald with the bench
#   channels on durable `chat:` and on volatile `live:`; socketio and
#   socketioxide may be added, and herald-chat-pb / herald-live-pb: the
#   same with the p2p and fan-out subscribers on the Centrifugo endpoint's
#   Protobuf wire, `--wire centrifugo-protobuf`, and herald-chat-json /
#   herald-live-json on its JSON wire, herald-chat-sse / herald-live-sse
#   on Server-Sent Events streams, `--wire sse`), scenarios "p2p fanout idle publish":
#   p2p and fanout with pipelined WebSocket publishers (--publish-via ws),
#   idle (Herald on `chat:`), HTTP publish (Herald only). Medians of
#   --reps (default 2), Herald/NATS ratios, and the targets.
#   Two-node servers, for the hot p2p and fanout only: herald-redis-chat and
#   herald-redis-live (two Herald nodes on one private Redis, AOF with
#   appendfsync always), nats-cluster (two routed nats-servers, core NATS)
#   and socketio-redis (two Socket.IO processes on @socket.io/redis-adapter
#   over a private Redis). The pipelined publisher connects to node A
#   (`--publish-target`), the subscribers to node B: every delivery
#   crosses nodes. Ratios: Herald on Redis over nats-cluster and over
#   socketio-redis.
#   nginx-201, for publish only: the HTTP ceiling, Debian nginx answering
#   Herald's publish requests with a fixed 201 (one process, keep-alive,
#   no access log), driven by the same 64 publishers as Herald's row.
#   durable-201, for publish only: the durable HTTP baseline
#   (crates/herald-bench/examples/durable_201.rs, $DURABLE_201), each
#   request's body appended to a file and fsynced (group commit) before its
#   201, nothing else: what a durable answer leaves of the ceiling.
# --suite compare: every scenario against every peer with HTTP publishers
#   (servers "herald ws socketio socketioxide nats", scenarios "idle fanout
#   p2p publish reconnect acked", --reps default 3).
#
# The herald binary is copied into DIR/bin first and used from there (for
# the server and the bench), so a rebuild during the run changes nothing.
# HERALD_BENCH names another binary for the bench alone (a before/after
# pair: the same load generator against an older server).
# --no-build skips bench/setup.sh and uses the binary as it is.
#
# Sizes come from the environment. hot: P2P_USERS (1000), P2P_MESSAGES
# (100000), SIZE (100 bytes), WINDOW (1000), FANOUT_SUBS (5000),
# FANOUT_MESSAGES (1000, back to back), FANOUT_PACED (100), FANOUT_RATE
# (10,max), IDLE_CONNS (15000), IDLE_HOLD (30s), PUBLISHERS (64),
# PUBLISH_MESSAGES (20000), TIMEOUT (300s, each phase's deadline). compare: the same names with the defaults of
# the figures in docs/benchmarks.md, plus RECONNECT_CLIENTS, ACKED_USERS,
# ACKED_MESSAGES and NAMESPACE (of the per-user channels of idle and p2p;
# default `user`; acked always runs on `user`). `--quick` shrinks them
# for a smoke run. WORKERS: subscriber worker processes at least (default:
# one per CPU core; `herald bench --workers`).
#
# `reconnect` and `acked` run against Herald only: the peers have no resume,
# so a dropped client loses what was published meanwhile by design, and no
# acked delivery.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

SUITE=hot
REPS=
SERVERS=
SCENARIOS=
OUT=
BUILD=1
QUICK=0
while [ $# -gt 0 ]; do
  case $1 in
    --suite) SUITE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$ROOT/bench/run.sh"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

case $SUITE in
  hot)
    REPS=${REPS:-2}
    SERVERS=${SERVERS:-herald-chat herald-live nats ws}
    SCENARIOS=${SCENARIOS:-p2p fanout idle publish}
    if [ "$QUICK" = 1 ]; then
      : "${P2P_USERS:=200}" "${P2P_MESSAGES:=20000}" "${FANOUT_SUBS:=500}" "${FANOUT_MESSAGES:=200}"
      : "${FANOUT_PACED:=20}" "${IDLE_CONNS:=2000}" "${IDLE_HOLD:=5s}" "${PUBLISH_MESSAGES:=2000}"
    fi
    P2P_USERS=${P2P_USERS:-1000}
    P2P_MESSAGES=${P2P_MESSAGES:-100000}
    SIZE=${SIZE:-100}
    WINDOW=${WINDOW:-1000}
    FANOUT_SUBS=${FANOUT_SUBS:-5000}
    FANOUT_MESSAGES=${FANOUT_MESSAGES:-1000}
    FANOUT_PACED=${FANOUT_PACED:-100}
    FANOUT_RATE=${FANOUT_RATE:-10,max}
    IDLE_CONNS=${IDLE_CONNS:-15000}
    IDLE_HOLD=${IDLE_HOLD:-30s}
    PUBLISHERS=${PUBLISHERS:-64}
    PUBLISH_MESSAGES=${PUBLISH_MESSAGES:-20000}
    TIMEOUT=${TIMEOUT:-300s}
    ;;
  compare)
    REPS=${REPS:-3}
    SERVERS=${SERVERS:-herald ws socketio socketioxide nats}
    SCENARIOS=${SCENARIOS:-idle fanout p2p publish reconnect acked}
    if [ "$QUICK" = 1 ]; then
      : "${IDLE_CONNS:=2000}" "${IDLE_HOLD:=5s}" "${FANOUT_SUBS:=500}" "${FANOUT_MESSAGES:=50}"
      : "${P2P_USERS:=200}" "${P2P_MESSAGES:=2000}" "${PUBLISH_MESSAGES:=2000}" "${RECONNECT_CLIENTS:=100}"
      : "${ACKED_USERS:=200}" "${ACKED_MESSAGES:=20}"
    fi
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
    ;;
  *) echo "unknown suite: $SUITE (hot or compare)" >&2; exit 2 ;;
esac

OUT=${OUT:-$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
JSON=$OUT/results.jsonl
LOG=$OUT/run.log

if [ "$BUILD" = 1 ]; then
  # herald-chat and herald-live are the herald build; the two-node servers
  # need their Redis too.
  setup=$(echo "$SERVERS" | tr ' ' '\n' | sed -e 's/^herald-redis-.*/herald redis/' -e 's/^herald-.*/herald/' \
    -e 's/^nats-cluster$/nats/' -e 's/^socketio-redis$/socketio redis/' -e 's/^nginx-201$/nginx/' |
    tr ' ' '\n' | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2086
  bash "$ROOT/bench/setup.sh" $setup >>"$LOG" 2>&1 || { echo "setup failed, see $LOG" >&2; exit 1; }
fi
mkdir -p "$OUT/bin"
cp "$HERALD" "$OUT/bin/herald" || { echo "no herald binary at $HERALD (run bench/setup.sh)" >&2; exit 1; }
HERALD=$OUT/bin/herald
# The load generator: the herald under test, or HERALD_BENCH (another
# build's `herald bench`, e.g. today's against an older server).
BENCH=$HERALD
if [ -n "${HERALD_BENCH:-}" ]; then
  cp "$HERALD_BENCH" "$OUT/bin/herald-bench" || { echo "no binary at HERALD_BENCH=$HERALD_BENCH" >&2; exit 1; }
  BENCH=$OUT/bin/herald-bench
fi

trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

# Whether this suite runs SCENARIO against SERVER.
runs() {
  local scenario=$1 server=$2
  # The Centrifugo wires (`-pb`, `-json`) are measured where subscribers receive.
  if [ "${server%-pb}" != "$server" ] || [ "${server%-json}" != "$server" ]; then
    case $scenario in p2p|fanout) return 0 ;; *) return 1 ;; esac
  fi
  # SSE streams: where subscribers receive, and an idle stream's cost.
  if [ "${server%-sse}" != "$server" ]; then
    case $scenario in p2p|fanout) return 0 ;; idle) [ "$server" = herald-chat-sse ] ;; *) return 1 ;; esac
    return
  fi
  # Two-node servers: where a publish on one node reaches subscribers on
  # the other.
  case $server in
    herald-redis-*|nats-cluster|socketio-redis)
      [ "$SUITE" = hot ] || return 1
      case $scenario in p2p|fanout) return 0 ;; *) return 1 ;; esac ;;
    # The HTTP ceiling answers publishes and nothing else.
    nginx-201|durable-201) [ "$scenario" = publish ]; return ;;
  esac
  case $SUITE/$scenario in
    */reconnect|*/acked) [ "$server" = herald ] ;;
    # One connection's idle cost does not depend on the namespace.
    hot/idle) [ "$server" != herald-live ] ;;
    # The HTTP publish row is Herald's own figure.
    hot/publish) [ "$server" = herald-chat ] || [ "$server" = herald ] ;;
    *) true ;;
  esac
}

scenario_args() {
  local scenario=$1 server=$2
  case $server in
    herald-chat|herald-redis-chat) echo -n "--namespace chat " ;;
    herald-live|herald-redis-live) echo -n "--namespace live " ;;
    herald-chat-pb) echo -n "--namespace chat --wire centrifugo-protobuf " ;;
    herald-live-pb) echo -n "--namespace live --wire centrifugo-protobuf " ;;
    herald-chat-json) echo -n "--namespace chat --wire centrifugo-json " ;;
    herald-live-json) echo -n "--namespace live --wire centrifugo-json " ;;
    herald-chat-sse) echo -n "--namespace chat --wire sse " ;;
    herald-live-sse) echo -n "--namespace live --wire sse " ;;
  esac
  case $SUITE/$scenario in
    hot/*) echo -n "--timeout $TIMEOUT " ;;
  esac
  case $SUITE/$scenario in
    hot/p2p) echo "--publish-via ws --window $WINDOW --connections $P2P_USERS --messages $P2P_MESSAGES --size $SIZE" ;;
    hot/fanout)
      echo "--publish-via ws --window $WINDOW --connections $FANOUT_SUBS --messages $FANOUT_MESSAGES" \
        "--paced-messages $FANOUT_PACED --rate $FANOUT_RATE --size $SIZE" ;;
    hot/idle) echo "--connections $IDLE_CONNS --hold $IDLE_HOLD" ;;
    hot/publish) echo "--publishers $PUBLISHERS --messages $PUBLISH_MESSAGES --size $SIZE" ;;
    compare/idle) echo "--connections $IDLE_CONNS --hold $IDLE_HOLD --namespace $NAMESPACE" ;;
    compare/fanout) echo "--connections $FANOUT_SUBS --messages $FANOUT_MESSAGES --rate $FANOUT_RATE" ;;
    compare/p2p) echo "--connections $P2P_USERS --messages $P2P_MESSAGES --namespace $NAMESPACE" ;;
    compare/publish) echo "--publishers $PUBLISHERS --messages $PUBLISH_MESSAGES" ;;
    compare/reconnect) echo "--connections $RECONNECT_CLIENTS" ;;
    compare/acked) echo "--connections $ACKED_USERS --messages $ACKED_MESSAGES --namespace user" ;;
  esac
}

failures=0
for rep in $(seq 1 "$REPS"); do
  for scenario in $SCENARIOS; do
    for server in $SERVERS; do
      runs "$scenario" "$server" || continue
      echo "== rep $rep/$REPS  $scenario  $server" | tee -a "$LOG"
      if ! start_server "$server" >>"$LOG" 2>&1; then
        echo "   !! $server did not start (see $LOG)" | tee -a "$LOG"
        stop_server
        failures=$((failures + 1))
        continue
      fi
      # pipefail: the pipeline fails when the bench does.
      # shellcheck disable=SC2046
      if ! "$BENCH" bench "$scenario" --target "$TARGET" "${PEER_ARGS[@]}" --server-pid "$SERVER_PID" \
          --label "rep=$rep" --json "$JSON" ${WORKERS:+--workers "$WORKERS"} $(scenario_args "$scenario" "$server") 2>&1 | tee -a "$LOG"; then
        failures=$((failures + 1))
      fi
      stop_server
      sleep 1
    done
  done
done

echo
if [ "$SUITE" = hot ]; then
  python3 "$ROOT/bench/table.py" --hot "$JSON" | tee "$OUT/table.md"
else
  python3 "$ROOT/bench/table.py" "$JSON" | tee "$OUT/table.md"
fi
echo
echo "results: $JSON  log: $LOG  table: $OUT/table.md"
if [ "$failures" -gt 0 ]; then
  echo "!! $failures run(s) failed verification or did not run; see $LOG" >&2
  exit 1
fi
