#!/usr/bin/env python3
"""The cost of a configuration reload on a node holding many connections.

    python3 bench/reload_cost.py target/release/herald [--conns 14000] [--reloads 10]

Starts `herald serve --dev` with a configuration file, opens --conns idle
WebSockets with `herald bench idle` (each subscribed to its own channel,
from worker processes: the open-files cap is per process), and once the
node counts them all, reloads --reloads times through
`POST /api/v1/admin/reload`, each time with a file that changes live keys
(an API key, `websocket.max_message_bytes`, `history.max_limit`, a
namespace's `history_size`). Prints the time of each reload call (request
to answer, over loopback), and the node's open, opened and server-closed
connection counts before and after (from /metrics). Asserts nothing.
A node's WebSocket cap is fitted to its open-files limit (about 14,900 at
20,000), so --conns stays under that. Every wait is bounded.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

KEY = "reload-bench-key-0123456789"


def config(variant):
    second = ', "reload-bench-key-second-01"' if variant else ""
    return (
        f'api_keys = ["{KEY}"{second}]\n'
        f"[websocket]\nmax_message_bytes = {131072 if variant else 65536}\n"
        f"[history]\nmax_limit = {2000 if variant else 1000}\n"
        '[namespaces.chat]\ndelivery = "durable"\n'
        f'[namespaces.user]\ndelivery = "acked"\nhistory_size = {20000 if variant else 10000}\n'
    )


def metrics(url):
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {"connections": 0, "opened": 0, "closed_by_server": 0}
    for line in text.splitlines():
        if line.startswith("herald_connections "):
            out["connections"] = int(float(line.split()[1]))
        elif line.startswith("herald_connections_opened_total "):
            out["opened"] = int(float(line.split()[1]))
        elif line.startswith("herald_closes_total{"):
            out["closed_by_server"] += int(float(line.split()[1]))
    return out


def wait_until(what, check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"timed out: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("herald")
    ap.add_argument("--conns", type=int, default=14000)
    ap.add_argument("--reloads", type=int, default=10)
    ap.add_argument("--port", type=int, default=18790)
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory(prefix="herald-reload.") as tmp:
        file = os.path.join(tmp, "herald.toml")
        with open(file, "w") as f:
            f.write(config(False))
        env = dict(os.environ, HERALD_LOG="warn", HERALD_DRAIN_PERIOD="0s")
        env.pop("HERALD_API_KEYS", None)
        server = subprocess.Popen(
            [args.herald, "serve", "--dev", "--config", file, "--data-dir", os.path.join(tmp, "data"),
             "--listen", f"127.0.0.1:{args.port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "server.log"), "w"))
        bench = None
        try:
            wait_until("the server", lambda: urllib.request.urlopen(f"{url}/healthz", timeout=2).status == 200, 30)
            bench = subprocess.Popen(
                [args.herald, "bench", "idle", "--target", url, "--dev", "--connections", str(args.conns),
                 "--hold", "90s", "--server-pid", str(server.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(f"{args.conns} connections", lambda: metrics(url)["connections"] >= args.conns, 180)
            time.sleep(2)
            before = metrics(url)
            times = []
            for i in range(args.reloads):
                with open(file, "w") as f:
                    f.write(config(i % 2 == 0))
                req = urllib.request.Request(f"{url}/api/v1/admin/reload", method="POST",
                                             headers={"Authorization": f"Bearer {KEY}"})
                t0 = time.perf_counter()
                status = urllib.request.urlopen(req, timeout=30).status
                times.append((time.perf_counter() - t0) * 1000)
                if status != 200:
                    sys.exit(f"reload {i} answered {status}")
                time.sleep(0.5)
            time.sleep(2)
            after = metrics(url)
        finally:
            for p in (bench, server):
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in (bench, server):
                if p is not None:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
    print(f"connections held: {before['connections']} before, {after['connections']} after the reloads")
    print(f"reloads: {len(times)}, each call (ms): min {min(times):.2f}, median {statistics.median(times):.2f}, "
          f"max {max(times):.2f}")
    print(f"connections opened meanwhile: {after['opened'] - before['opened']}, "
          f"closed by the server meanwhile: {after['closed_by_server'] - before['closed_by_server']}")


if __name__ == "__main__":
    main()
