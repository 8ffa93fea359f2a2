# Sourced by bench/run.sh: start and stop one server under test.
#
# start_server NAME sets SERVER_PID (the process whose /proc the bench
# reads), TARGET (the --target URL) and PEER_ARGS (extra bench flags).
# Herald runs with bench/herald.toml (the defaults, with a frame budget a
# pipelined publisher fits in).
# Every server starts fresh for every run, so RSS baselines are comparable.
#
# The two-node servers (herald-redis-chat, herald-redis-live, nats-cluster,
# socketio-redis) start several processes: a private redis-server where one
# is needed, node A and node B. TARGET is node B (the subscribers'),
# SERVER_PID node B's process, and PEER_ARGS carries `--publish-target`
# node A, so the pipelined publisher enters on A and every delivery
# crosses nodes.
#
# stop_server stops exactly the processes start_server started (every one
# is in SERVER_PIDS, the last started stopped first) and removes its temp
# dir.

ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# The binary under test: $HERALD, else the $HERALD_BUILD build: `release`
# (the default, the one an operator ships), or `profiling`, which the
# callgrind scripts set before sourcing this file (Cargo.toml's
# [profile.profiling]: the same code with debug info, so callgrind_annotate
# names files and lines).
HERALD=${HERALD:-$ROOT/target/${HERALD_BUILD:-release}/herald}
HERALD_PORT=${HERALD_PORT:-18700}
WS_PORT=${WS_PORT:-18801}
SOCKETIO_PORT=${SOCKETIO_PORT:-18802}
SOCKETIOXIDE_PORT=${SOCKETIOXIDE_PORT:-18803}
# Fixed in bench/peers/nats/nats.conf.
NATS_WS_PORT=4280
NATS_PORT=4223
# Two-node servers: node A (publisher) and node B (subscribers).
HERALD_A_PORT=${HERALD_A_PORT:-18710}
HERALD_B_PORT=${HERALD_B_PORT:-18711}
SOCKETIO_A_PORT=${SOCKETIO_A_PORT:-18812}
SOCKETIO_B_PORT=${SOCKETIO_B_PORT:-18813}
# Fixed in bench/peers/nats/cluster-{a,b}.conf.
NATS_A_PORT=4224
NATS_A_WS_PORT=4281
NATS_B_WS_PORT=4282
# nginx-201, the HTTP ceiling.
NGINX_PORT=${NGINX_PORT:-18804}
# durable-201, the durable HTTP baseline (bench/setup.sh durable-201 builds it).
DURABLE_201_PORT=${DURABLE_201_PORT:-18805}
DURABLE_201=${DURABLE_201:-$ROOT/target/release/examples/durable_201}

SERVER_PID=
SERVER_PIDS=()
SERVER_DIR=

# Poll until a command succeeds, at most 15 s.
wait_for() {
  local i
  for i in $(seq 1 150); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "server did not come up: $*" >&2
  return 1
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Run a command in the background as one more process of this server:
# spawn LOG CMD ARGS... (its pid is in SERVER_PIDS and in $SPAWNED).
SPAWNED=
spawn() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  SPAWNED=$!
  SERVER_PIDS+=("$SPAWNED")
}

# A private redis-server in the server's temp dir on a free port; sets
# REDIS_URL. start_redis durable|volatile: durable is AOF with an fsync
# per write (`appendfsync always`, what Herald's durable channels promise
# on Redis), volatile no persistence at all.
start_redis() {
  local port dir=$SERVER_DIR/redis
  local persist=(--appendonly no)
  [ "$1" = durable ] && persist=(--appendonly yes --appendfsync always)
  port=$(free_port)
  mkdir -p "$dir"
  spawn "$SERVER_DIR/redis.log" redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' "${persist[@]}"
  REDIS_URL=redis://127.0.0.1:$port
  wait_for redis-cli -p "$port" ping
}

# One Herald node on the bench Redis: start_herald_node NAME PORT.
start_herald_node() {
  spawn "$SERVER_DIR/$1.log" env HERALD_LOG=warn HERALD_DRAIN_PERIOD=0s "$HERALD" serve --dev \
    --config "$ROOT/bench/herald.toml" --engine redis --redis-url "$REDIS_URL" --listen "127.0.0.1:$2"
  wait_for curl -sf "http://127.0.0.1:$2/readyz"
}

# nginx answering every request with a fixed 201 (GET /version: its
# version). One process (`master_process off`: the process that answers
# is the one whose /proc the bench reads), keep-alive, no access log.
nginx_201_conf() {
  local dir=$1
  cat <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  default_type application/json;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location = /version { default_type text/plain; return 200 "nginx \$nginx_version\n"; }
    location / { return 201 '{"seq":1}'; }
  }
}
CONF
}

start_server() {
  local name=$1 log
  SERVER_DIR=$(mktemp -d /tmp/herald-bench.XXXXXX)
  log=$SERVER_DIR/server.log
  PEER_ARGS=(--peer "$name")
  SERVER_PIDS=()
  case $name in
    herald|herald-chat|herald-live|herald-chat-pb|herald-live-pb|herald-chat-json|herald-live-json|herald-chat-sse|herald-live-sse)
      # herald-chat / herald-live: the same server; bench/run.sh puts the
      # bench channels on `chat:` (durable) or `live:` (volatile); the
      # `-pb` and `-json` ones have their subscribers on the Centrifugo
      # endpoint's Protobuf or JSON wire, the `-sse` ones on /sse streams.
      PEER_ARGS=(--peer herald --dev)
      HERALD_LOG=warn HERALD_DRAIN_PERIOD=0s "$HERALD" serve --dev --config "$ROOT/bench/herald.toml" --data-dir "$SERVER_DIR/data" \
        --listen "127.0.0.1:$HERALD_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      TARGET=http://127.0.0.1:$HERALD_PORT
      wait_for curl -sf "$TARGET/healthz"
      ;;
    ws)
      node "$ROOT/bench/peers/node/ws-server.js" "$WS_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      TARGET=http://127.0.0.1:$WS_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    socketio)
      node "$ROOT/bench/peers/node/socketio-server.js" "$SOCKETIO_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      TARGET=http://127.0.0.1:$SOCKETIO_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    socketioxide)
      "$ROOT/bench/peers/socketioxide/target/release/socketioxide-peer" "$SOCKETIOXIDE_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      TARGET=http://127.0.0.1:$SOCKETIOXIDE_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    nats)
      nats-server -c "$ROOT/bench/peers/nats/nats.conf" >"$log" 2>&1 &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      TARGET=http://127.0.0.1:$NATS_WS_PORT
      PEER_ARGS+=(--nats-publish "127.0.0.1:$NATS_PORT")
      wait_for port_open "$NATS_PORT"
      wait_for port_open "$NATS_WS_PORT"
      ;;
    herald-redis-chat|herald-redis-live)
      # Two Herald nodes on one Redis (AOF, fsync always); run.sh puts the
      # bench channels on `chat:` (durable) or `live:` (volatile).
      start_redis durable || return 1
      start_herald_node node-a "$HERALD_A_PORT" || return 1
      start_herald_node node-b "$HERALD_B_PORT" || return 1
      SERVER_PID=$SPAWNED
      TARGET=http://127.0.0.1:$HERALD_B_PORT
      PEER_ARGS=(--peer herald --dev --publish-target "http://127.0.0.1:$HERALD_A_PORT")
      ;;
    nats-cluster)
      spawn "$SERVER_DIR/node-a.log" nats-server -c "$ROOT/bench/peers/nats/cluster-a.conf"
      spawn "$SERVER_DIR/node-b.log" nats-server -c "$ROOT/bench/peers/nats/cluster-b.conf"
      SERVER_PID=$SPAWNED
      TARGET=http://127.0.0.1:$NATS_B_WS_PORT
      PEER_ARGS=(--peer nats --publish-target "http://127.0.0.1:$NATS_A_WS_PORT" --nats-publish "127.0.0.1:$NATS_A_PORT")
      wait_for port_open "$NATS_A_WS_PORT" || return 1
      wait_for port_open "$NATS_B_WS_PORT" || return 1
      # The route is up once both ends logged it.
      wait_for grep -q "Route connection created" "$SERVER_DIR/node-a.log" || return 1
      wait_for grep -q "Route connection created" "$SERVER_DIR/node-b.log"
      ;;
    socketio-redis)
      # Two Socket.IO processes on @socket.io/redis-adapter over a private,
      # unpersisted Redis.
      start_redis volatile || return 1
      spawn "$SERVER_DIR/node-a.log" node "$ROOT/bench/peers/node/socketio-server.js" "$SOCKETIO_A_PORT" "$REDIS_URL"
      spawn "$SERVER_DIR/node-b.log" node "$ROOT/bench/peers/node/socketio-server.js" "$SOCKETIO_B_PORT" "$REDIS_URL"
      SERVER_PID=$SPAWNED
      TARGET=http://127.0.0.1:$SOCKETIO_B_PORT
      PEER_ARGS=(--peer socketio --publish-target "http://127.0.0.1:$SOCKETIO_A_PORT")
      wait_for curl -sf "http://127.0.0.1:$SOCKETIO_A_PORT/version" || return 1
      wait_for curl -sf "$TARGET/version"
      ;;
    nginx-201)
      # The HTTP ceiling: Herald's publish requests answered 201 by nginx.
      nginx_201_conf "$SERVER_DIR" >"$SERVER_DIR/nginx.conf"
      spawn "$log" nginx -p "$SERVER_DIR" -c "$SERVER_DIR/nginx.conf"
      SERVER_PID=$SPAWNED
      TARGET=http://127.0.0.1:$NGINX_PORT
      PEER_ARGS=(--peer http201)
      wait_for curl -sf "$TARGET/version"
      ;;
    durable-201)
      # The durable HTTP baseline: each request's body appended and fsynced
      # (group commit) before its 201, nothing else.
      spawn "$log" "$DURABLE_201" "127.0.0.1:$DURABLE_201_PORT" "$SERVER_DIR/durable-201.log"
      SERVER_PID=$SPAWNED
      TARGET=http://127.0.0.1:$DURABLE_201_PORT
      PEER_ARGS=(--peer http201)
      wait_for curl -sf "$TARGET/version"
      ;;
    *)
      echo "unknown server: $name" >&2
      return 2
      ;;
  esac
}

stop_server() {
  local i k pid
  # Last started first: the nodes before the Redis they use.
  for ((k = ${#SERVER_PIDS[@]} - 1; k >= 0; k--)); do
    pid=${SERVER_PIDS[k]}
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  SERVER_PIDS=()
  SERVER_PID=
  [ -n "$SERVER_DIR" ] && rm -rf "$SERVER_DIR"
  SERVER_DIR=
}

# For the callgrind scripts: start_callgrind_herald OUTFILE CONFIG PORT LOG
# runs Herald under valgrind --tool=callgrind (a fresh data dir) and waits
# until it answers (valgrind is slow: up to 2 minutes); stop_callgrind_herald
# stops it with SIGTERM, a clean shutdown after which callgrind writes its
# file (killed after 120 s, and then there is no count). callgrind_total
# FILE prints the instruction total of a profile. A script using them
# traps EXIT with stop_callgrind_herald.
CALLGRIND_PID=
CALLGRIND_DIR=
start_callgrind_herald() {
  local out=$1 config=$2 port=$3 log=$4 i
  CALLGRIND_DIR=$(mktemp -d /tmp/herald-callgrind.XXXXXX)
  HERALD_LOG=warn HERALD_DRAIN_PERIOD=0s valgrind --tool=callgrind --callgrind-out-file="$out" "$HERALD" serve --dev \
    --config "$config" --data-dir "$CALLGRIND_DIR/data" --listen "127.0.0.1:$port" >"$log" 2>&1 &
  CALLGRIND_PID=$!
  for i in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "herald under callgrind did not come up (see $log)" >&2
  stop_callgrind_herald
  return 1
}

stop_callgrind_herald() {
  [ -n "$CALLGRIND_PID" ] || return 0
  kill -TERM "$CALLGRIND_PID" 2>/dev/null || true
  local i
  for i in $(seq 1 1200); do
    kill -0 "$CALLGRIND_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$CALLGRIND_PID" 2>/dev/null; then
    echo "   !! herald under callgrind did not stop in 120 s; killed (no count)" >&2
    kill -9 "$CALLGRIND_PID" 2>/dev/null || true
  fi
  wait "$CALLGRIND_PID" 2>/dev/null || true
  CALLGRIND_PID=
  [ -n "$CALLGRIND_DIR" ] && rm -rf "$CALLGRIND_DIR"
  CALLGRIND_DIR=
}

callgrind_total() {
  awk '/^(totals|summary):/ { print $2; exit }' "$1"
}

# The start of bench/callgrind-NAME.sh (publish, idle): callgrind_script
# NAME DEFAULT_PORT "$@" reads the options, setting HERALD (--herald), OUT
# (--out, else bench/results/callgrind-NAME-<time>, made here) and PORT
# (--port, else DEFAULT_PORT), and stops the server on exit; --help prints
# the script's header.
callgrind_script() {
  local name=$1 script=$ROOT/bench/callgrind-$1.sh
  PORT=$2
  OUT=
  shift 2
  trap stop_callgrind_herald EXIT
  while [ $# -gt 0 ]; do
    case $1 in
      --herald) HERALD=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --port) PORT=$2; shift 2 ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$script"; exit 0 ;;
      *) echo "unknown option: $1" >&2; exit 2 ;;
    esac
  done
  require_herald
  OUT=${OUT:-$ROOT/bench/results/callgrind-$name-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$OUT"
}

# Exit with how to build it unless $HERALD is an executable.
require_herald() {
  [ -x "$HERALD" ] && return 0
  case $HERALD in
    */target/profiling/herald) echo "no herald binary at $HERALD (cargo build --profile profiling -p herald)" >&2 ;;
    *) echo "no herald binary at $HERALD (cargo build --release -p herald)" >&2 ;;
  esac
  exit 1
}
