#!/usr/bin/env bash
# Build Herald and install the peer servers used by bench/run.sh.
#
#   bench/setup.sh            everything
#   bench/setup.sh herald ws  only these (herald ws socketio socketioxide nats
#                             redis nginx durable-201)
#
# Node peers: `npm ci` from the committed package-lock.json (Node >= 20):
# ws, socket.io, @socket.io/redis-adapter and the `redis` client.
# socketioxide: its own Cargo project and Cargo.lock (not a workspace member).
# NATS, Redis (the two-node servers' private redis-server) and nginx (the
# HTTP ceiling): the Debian packages `nats-server`, `redis-server` and
# `nginx`, installed with apt-get if missing. durable-201 (the durable HTTP
# baseline): an example of herald-bench, built in release.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
servers=${*:-herald ws socketio socketioxide nats redis nginx durable-201}

# apt_install COMMAND PACKAGE: install the Debian package unless COMMAND exists.
apt_install() {
  if ! command -v "$1" >/dev/null; then
    echo "== installing $2 (apt-get)"
    apt-get update && apt-get install -y "$2"
  fi
}

for s in $servers; do
  case $s in
    herald)
      echo "== building herald (release)"
      cargo build --release -p herald
      ;;
    ws|socketio)
      modules=$ROOT/bench/peers/node/node_modules
      if [ ! -d "$modules/ws" ] || [ ! -d "$modules/socket.io" ] || [ ! -d "$modules/@socket.io/redis-adapter" ] ||
        [ ! -d "$modules/redis" ]; then
        echo "== npm ci in bench/peers/node"
        (cd "$ROOT/bench/peers/node" && npm ci --no-audit --no-fund)
      fi
      ;;
    socketioxide)
      echo "== building bench/peers/socketioxide (release)"
      (cd "$ROOT/bench/peers/socketioxide" && cargo build --release --locked)
      ;;
    nats) apt_install nats-server nats-server ;;
    redis) apt_install redis-server redis-server ;;
    nginx) apt_install nginx nginx ;;
    durable-201)
      echo "== building the durable HTTP baseline (release)"
      cargo build --release -p herald-bench --example durable_201
      ;;
    *)
      echo "unknown server: $s" >&2
      exit 2
      ;;
  esac
done
echo "== setup done: $servers"
