# Sourced by bench/run.sh: start and stop one server under test.
#
# start_server NAME sets SERVER_PID (the process whose /proc the bench
# reads), TARGET (the --target URL) and PEER_ARGS (extra bench flags).
# Herald runs with bench/herald.toml (the defaults, with a frame budget a
# pipelined publisher fits in).
# Every server starts fresh for every run, so RSS baselines are comparable.
# stop_server stops exactly the process start_server started.

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

SERVER_PID=
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

start_server() {
  local name=$1 log
  SERVER_DIR=$(mktemp -d /tmp/herald-bench.XXXXXX)
  log=$SERVER_DIR/server.log
  PEER_ARGS=(--peer "$name")
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
      TARGET=http://127.0.0.1:$HERALD_PORT
      wait_for curl -sf "$TARGET/healthz"
      ;;
    ws)
      node "$ROOT/bench/peers/node/ws-server.js" "$WS_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      TARGET=http://127.0.0.1:$WS_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    socketio)
      node "$ROOT/bench/peers/node/socketio-server.js" "$SOCKETIO_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      TARGET=http://127.0.0.1:$SOCKETIO_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    socketioxide)
      "$ROOT/bench/peers/socketioxide/target/release/socketioxide-peer" "$SOCKETIOXIDE_PORT" >"$log" 2>&1 &
      SERVER_PID=$!
      TARGET=http://127.0.0.1:$SOCKETIOXIDE_PORT
      wait_for curl -sf "$TARGET/version"
      ;;
    nats)
      nats-server -c "$ROOT/bench/peers/nats/nats.conf" >"$log" 2>&1 &
      SERVER_PID=$!
      TARGET=http://127.0.0.1:$NATS_WS_PORT
      PEER_ARGS+=(--nats-publish "127.0.0.1:$NATS_PORT")
      wait_for port_open "$NATS_PORT"
      wait_for port_open "$NATS_WS_PORT"
      ;;
    *)
      echo "unknown server: $name" >&2
      return 2
      ;;
  esac
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill "$SERVER_PID" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
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
