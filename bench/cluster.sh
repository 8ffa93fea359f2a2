#!/usr/bin/env bash
# A cluster on one box: NODES Herald nodes on one Redis, CONNECTIONS
# WebSocket connections spread round-robin over them (each node and each
# bench worker process under the open-files cap), then a broadcast,
# point-to-point traffic with one node killed (SIGKILL) halfway and its
# clients resumed on the others, and presence churn (`herald bench
# cluster`). Prints connections reached, deliveries/s per phase, RSS per
# connection per node, node and Redis CPU, Redis commands per message,
# the killed node's clients' reconnect time, and lost / duplicated /
# reordered (the run exits non-zero unless all three are 0).
#
#   bench/cluster.sh [--quick] [--out DIR] [--herald PATH]
#
# Starts its own redis-server (AOF, appendfsync $APPENDFSYNC) on a free
# port in a temp dir and its own nodes (the config below), and stops every
# process it started on every exit path. The bench is bounded by --timeout
# per phase and the whole run by DEADLINE.
#
# Sizes from the environment (defaults: the full run; --quick: 6,000
# connections on 3 nodes, about a minute):
#   NODES (8), CONNECTIONS (100000), KILL_NODE (NODES-1; "none": no kill),
#   BROADCAST_MESSAGES (10), BROADCAST_RATE (1 message/s),
#   P2P_ROUNDS (2 messages per user), P2P_RATE (5000 messages/s in all),
#   CHURN_CLIENTS (1000), CHURN_ROUNDS (4), SIZE (100 bytes),
#   IDLE_HOLD (10s: the p2p connections held idle before traffic),
#   CONNS_PER_WORKER (8000), APPENDFSYNC (everysec; or always),
#   HEAD_CHECK_INTERVAL (10s: redis.head_check_interval; each node runs one
#   script per quiet watched channel per interval, 100,000 a second at the
#   default 1s with 100,000 per-user channels),
#   COMMAND_TIMEOUT (5s: redis.command_timeout; the box runs every node,
#   every client and Redis on its cores, and a node starved of CPU for the
#   default 2 s takes Redis for down and refuses publishes),
#   RESUME_JITTER (2s: a client of the killed node waits a random time below
#   this before it resumes on another node, as SDKs back off),
#   TIMEOUT (300s, each phase), DEADLINE (1800, seconds for the whole bench).
set -euo pipefail
cd "$(dirname "$0")/.."
HERALD=${HERALD:-${CARGO_TARGET_DIR:-target}/release/herald}
OUT=
QUICK=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --herald) HERALD=$2; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 64 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  : "${NODES:=3}" "${CONNECTIONS:=6000}" "${BROADCAST_MESSAGES:=10}" "${BROADCAST_RATE:=5}"
  : "${P2P_ROUNDS:=4}" "${P2P_RATE:=4000}" "${CHURN_CLIENTS:=300}" "${CHURN_ROUNDS:=3}"
  : "${IDLE_HOLD:=3s}" "${TIMEOUT:=60s}" "${DEADLINE:=300}"
fi
NODES=${NODES:-8}
CONNECTIONS=${CONNECTIONS:-100000}
KILL_NODE=${KILL_NODE:-$((NODES - 1))}
BROADCAST_MESSAGES=${BROADCAST_MESSAGES:-10}
BROADCAST_RATE=${BROADCAST_RATE:-1}
P2P_ROUNDS=${P2P_ROUNDS:-2}
P2P_RATE=${P2P_RATE:-5000}
CHURN_CLIENTS=${CHURN_CLIENTS:-1000}
CHURN_ROUNDS=${CHURN_ROUNDS:-4}
SIZE=${SIZE:-100}
IDLE_HOLD=${IDLE_HOLD:-10s}
CONNS_PER_WORKER=${CONNS_PER_WORKER:-8000}
APPENDFSYNC=${APPENDFSYNC:-everysec}
HEAD_CHECK_INTERVAL=${HEAD_CHECK_INTERVAL:-10s}
COMMAND_TIMEOUT=${COMMAND_TIMEOUT:-5s}
RESUME_JITTER=${RESUME_JITTER:-2s}
TIMEOUT=${TIMEOUT:-300s}
DEADLINE=${DEADLINE:-1800}
[ -x "$HERALD" ] || { echo "no herald binary at $HERALD (cargo build --release -p herald)" >&2; exit 1; }
OUT=${OUT:-bench/results/cluster-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
JSON=$OUT/results.jsonl

TMP=$(mktemp -d /tmp/herald-cluster.XXXXXX)
PIDS=()
any_alive() {
  local p
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
# Every process started here: SIGTERM, up to 5 s to exit, then SIGKILL.
cleanup() {
  local p _
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    any_alive || break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {
  local _
  for _ in $(seq 1 200); do
    curl -sf "http://$1/readyz" >/dev/null && return 0
    sleep 0.05
  done
  echo "node $1 not ready (see $OUT)" >&2
  exit 1
}
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
rss_mb() { awk '/^VmRSS:/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }

RPORT=$(free_port)
mkdir -p "$TMP/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$TMP/redis" --save '' \
  --appendonly yes --appendfsync "$APPENDFSYNC" >"$OUT/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$RPORT" ping >/dev/null || { echo "redis-server did not start (see $OUT/redis.log)" >&2; exit 1; }

# The head check interval, bench/herald.toml's limits, no drain on
# shutdown, and the two namespaces
# the bench uses: `chat` (durable: the log in Redis is what a resumed
# client reads from) and `presence` (members, joins and leaves).
cat >"$TMP/herald.toml" <<EOF
[redis]
head_check_interval = "$HEAD_CHECK_INTERVAL"
command_timeout = "$COMMAND_TIMEOUT"

[rate_limits]
client_frames_per_sec = 1000000

[http]
max_connections = 2048

[shutdown]
drain_period = "0s"

[namespaces.chat]
delivery = "durable"
client_publish = true

[namespaces.presence]
delivery = "volatile"
presence = true

[websocket]
max_publishes_in_flight = 1024
EOF

cp "$TMP/herald.toml" "$OUT/herald.toml"
TARGETS=()
NODE_PIDS=()
for k in $(seq 0 $((NODES - 1))); do
  addr=127.0.0.1:$(free_port)
  HERALD_LOG=warn "$HERALD" serve --dev --config "$TMP/herald.toml" --listen "$addr" \
    --engine redis --redis-url "redis://127.0.0.1:$RPORT" >"$OUT/node-$k.log" 2>&1 &
  PIDS+=($!)
  NODE_PIDS+=($!)
  TARGETS+=("http://$addr")
  wait_ready "$addr"
done
join() { local IFS=,; echo "$*"; }
KILL_ARGS=()
[ "$KILL_NODE" = none ] || KILL_ARGS=(--kill-node "$KILL_NODE")

echo "== cluster: $NODES nodes, $CONNECTIONS connections, redis appendfsync $APPENDFSYNC (pid $REDIS_PID)," \
  "head_check_interval $HEAD_CHECK_INTERVAL, command_timeout $COMMAND_TIMEOUT, out $OUT"
redis_cpu0=$(cpu_s "$REDIS_PID")
rc=0
timeout --kill-after=10s "$DEADLINE" "$HERALD" bench cluster --dev \
  --targets "$(join "${TARGETS[@]}")" --server-pids "$(join "${NODE_PIDS[@]}")" \
  --redis-addr "127.0.0.1:$RPORT" --redis-pid "$REDIS_PID" "${KILL_ARGS[@]}" \
  --connections "$CONNECTIONS" --conns-per-worker "$CONNS_PER_WORKER" --size "$SIZE" \
  --broadcast-messages "$BROADCAST_MESSAGES" --broadcast-rate "$BROADCAST_RATE" \
  --messages "$P2P_ROUNDS" --rate "$P2P_RATE" \
  --churn-clients "$CHURN_CLIENTS" --churn-rounds "$CHURN_ROUNDS" --hold "$IDLE_HOLD" --jitter "$RESUME_JITTER" \
  --timeout "$TIMEOUT" --json "$JSON" --label "cluster-$NODES-$CONNECTIONS" || rc=$?

echo "== after the bench"
echo "   redis-server: CPU $(awk -v a="$redis_cpu0" -v b="$(cpu_s "$REDIS_PID")" 'BEGIN { printf "%.2f", b - a }') s over the bench, RSS $(rss_mb "$REDIS_PID") MB, AOF $(du -sh "$TMP/redis" | cut -f1)"
for k in $(seq 0 $((NODES - 1))); do
  p=${NODE_PIDS[$k]}
  if [ -e "/proc/$p/stat" ]; then
    echo "   node $k (pid $p): CPU $(cpu_s "$p") s since start, RSS $(rss_mb "$p") MB"
  else
    echo "   node $k (pid $p): gone (killed)"
  fi
done
echo "   results: $JSON"
if [ "$rc" -ne 0 ]; then
  echo "== cluster bench FAILED (exit $rc)" >&2
fi
exit "$rc"
