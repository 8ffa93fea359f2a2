#!/usr/bin/env bash
# The outbox consumer's figures: rows/s from COMMIT to subscriber with one
# and eight partitions, and COMMIT -> delivery latency (p50, p99) at a fixed
# rate, on the embedded and the Redis engine. Prints a Markdown table.
#
#   bench/outbox.sh [--herald PATH]
#
# Builds the release binary and the bench program
# (crates/herald/examples/outbox_bench.rs), which starts its own PostgreSQL
# (initdb + pg_ctl, fsync off), redis-server and Herald node per run and
# checks that every row arrives once. Sizes from the environment: ROWS
# (10000), CHANNELS (50), WRITERS (8), RATE (1000), LATENCY_ROWS (5000).
set -euo pipefail
cd "$(dirname "$0")/.."
HERALD=${HERALD:-target/release/herald}
while [ $# -gt 0 ]; do
  case $1 in
    --herald) HERALD=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 64 ;;
  esac
done
if [ "$HERALD" = target/release/herald ]; then
  cargo build --release -p herald --bin herald
fi
cargo build --release -p herald --example outbox_bench
target/release/examples/outbox_bench "$HERALD"
