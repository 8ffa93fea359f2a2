#!/usr/bin/env bash
# Build Herald and install the peer servers used by bench/run.sh.
#
#   bench/setup.sh            everything
#   bench/setup.sh herald ws  only these (herald ws socketio socketioxide nats)
#
# Node peers: `npm ci` from the committed package-lock.json (Node >= 20).
# socketioxide: its own Cargo project and Cargo.lock (not a workspace member).
# NATS: the Debian `nats-server` package, installed with apt-get if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
servers=${*:-herald ws socketio socketioxide nats}

for s in $servers; do
  case $s in
    herald)
      echo "== building herald (release)"
      cargo build --release -p herald
      ;;
    ws|socketio)
      if [ ! -d "$ROOT/bench/peers/node/node_modules/ws" ] || [ ! -d "$ROOT/bench/peers/node/node_modules/socket.io" ]; then
        echo "== npm ci in bench/peers/node"
        (cd "$ROOT/bench/peers/node" && npm ci --no-audit --no-fund)
      fi
      ;;
    socketioxide)
      echo "== building bench/peers/socketioxide (release)"
      (cd "$ROOT/bench/peers/socketioxide" && cargo build --release --locked)
      ;;
    nats)
      if ! command -v nats-server >/dev/null; then
        echo "== installing nats-server (apt-get)"
        apt-get update && apt-get install -y nats-server
      fi
      ;;
    *)
      echo "unknown server: $s" >&2
      exit 2
      ;;
  esac
done
echo "== setup done: $servers"
