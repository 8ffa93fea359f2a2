#!/usr/bin/env python3
"""The backend in control, measured: two nodes on one Redis, many users.

    python3 bench/control.py target/release/herald [--users 1000] [--per-user 10]
        [--procs 4] [--calls 32] [--lists 20]

Starts a Redis (`redis-server` on a free port, no persistence) and two
nodes, A and B (`herald serve --dev --engine redis`), and opens
--users x --per-user WebSockets, each user's connections alternating
between A and B, from --procs client processes. Then, with --calls calls
in flight at a time, all to node A (one call per user):

1. `POST /api/v1/users/{user}/subscriptions` (a durable channel per user):
   the time from the first call to the last connection's `subscribed`
   frame, and per user from its call to its last connection's frame;
2. the lists at this many connections: `GET /api/v1/channels?limit=1000`
   and `GET /api/v1/users/{user}/connections`, --lists times each
   (gathered from both nodes), median and worst;
3. `POST /api/v1/users/{user}/disconnect`: the time from the first call
   to the last connection's close, and per user.

Prints the figures; asserts only that every connection was reached.
Standard library only (the WebSocket client is drain.py's). The client
processes' timings include their own event-loop lag: run it on an
otherwise idle machine.
"""
import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from drain import API_KEY, Ws, free_port, post, start_node


def client_proc(idx, ports, conns, q, go_q):
    """Open `conns` ((user, node index) pairs); record when each one got
    its `subscribed` frame and its close; report when told."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def one(user, port, out):
        ws = await Ws.connect(port, user)
        while True:
            kind, v = await ws.recv()
            if kind == "text" and v.get("type") == "subscribed":
                out["subscribed"] = time.time()
            elif kind in ("close", "eof"):
                out["closed"] = (time.time(), v)
                ws.close()
                return

    async def run():
        outs = [{"user": u} for u, _ in conns]
        tasks = []
        for k, (u, node) in enumerate(conns):
            tasks.append(asyncio.create_task(one(u, ports[node], outs[k])))
            if k % 200 == 199:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1)
        q.put(("ready", idx))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, go_q.get)
        deadline = time.time() + 120
        while time.time() < deadline and not all("closed" in o for o in outs):
            await asyncio.sleep(0.2)
        q.put(("result", outs))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


def get(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"authorization": f"Bearer {API_KEY}"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return time.perf_counter() - t


def calls(port, users, path_of, body, in_flight):
    """One call per user, `in_flight` at a time; the start time of each."""
    started = {}

    def call(u):
        started[u] = time.time()
        post(port, path_of(u), body(u))

    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(call, users))
    return started


def spread(started, done, users):
    """First call to last event, and per user call to its last event."""
    first = min(started.values())
    last = max(max(done[u]) for u in users)
    per_user = sorted(max(done[u]) - started[u] for u in users)
    p = lambda q: per_user[min(len(per_user) - 1, int(q * len(per_user)))]
    return last - first, p(0.5), p(0.99), per_user[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("herald")
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--per-user", type=int, default=10)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--calls", type=int, default=32, help="API calls in flight at a time")
    ap.add_argument("--lists", type=int, default=20)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = tempfile.mkdtemp(prefix="herald-control-")
    redis_port, port_a, port_b = free_port(), free_port(), free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no",
                              "--maxclients", "50000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs, nodes = [], []
    try:
        time.sleep(0.5)
        nodes = [start_node(args.herald, tmp, n, p, redis_port, "0s") for n, p in (("a", port_a), ("b", port_b))]
        users = [f"u{i}" for i in range(args.users)]
        conns = [(u, k % 2) for u in users for k in range(args.per_user)]
        total = len(conns)
        q, go_qs = multiprocessing.Queue(), []
        for p in range(args.procs):
            go = multiprocessing.Queue()
            go_qs.append(go)
            pr = multiprocessing.Process(target=client_proc, args=(p, (port_a, port_b), conns[p::args.procs], q, go))
            pr.start()
            procs.append(pr)
        for _ in procs:
            assert q.get(timeout=600)[0] == "ready"
        time.sleep(2)
        print(f"{total} connections of {args.users} users on two nodes; {args.calls} calls in flight, all to node A")

        sub_started = calls(port_a, users, lambda u: f"/api/v1/users/{u}/subscriptions",
                            lambda u: {"channel": f"drain:{u}"}, args.calls)
        time.sleep(3)
        lists_c = sorted(get(port_a, "/api/v1/channels?limit=1000") for _ in range(args.lists))
        lists_u = sorted(get(port_a, f"/api/v1/users/{users[i % len(users)]}/connections") for i in range(args.lists))
        dis_started = calls(port_a, users, lambda u: f"/api/v1/users/{u}/disconnect",
                            lambda u: {"reconnect": False}, args.calls)
        for go in go_qs:
            go.put(True)
        outs = []
        for _ in procs:
            kind, res = q.get(timeout=300)
            outs.extend(res)
        subscribed = {u: [] for u in users}
        closed = {u: [] for u in users}
        for o in outs:
            if "subscribed" in o:
                subscribed[o["user"]].append(o["subscribed"])
            if "closed" in o:
                closed[o["user"]].append(o["closed"][0])
        n_sub = sum(len(v) for v in subscribed.values())
        n_closed = sum(len(v) for v in closed.values())
        print(f"subscribe: {n_sub}/{total} connections told")
        if n_sub == total:
            whole, p50, p99, worst = spread(sub_started, subscribed, users)
            print(f"  first call to last `subscribed`: {whole * 1000:.0f} ms; per user (call to its last connection): "
                  f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
        print(f"lists at {total} connections (gathered from both nodes), {args.lists} each:")
        print(f"  GET /api/v1/channels?limit=1000: median {statistics.median(lists_c) * 1000:.1f} ms, max {lists_c[-1] * 1000:.1f} ms")
        print(f"  GET /api/v1/users/{{user}}/connections: median {statistics.median(lists_u) * 1000:.1f} ms, max {lists_u[-1] * 1000:.1f} ms")
        print(f"disconnect: {n_closed}/{total} connections closed")
        if n_closed == total:
            whole, p50, p99, worst = spread(dis_started, closed, users)
            print(f"  first call to last close: {whole * 1000:.0f} ms; per user (call to its last connection): "
                  f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    finally:
        for pr in procs:
            pr.kill()
        for n in nodes:
            n.kill()
        redis.kill()


if __name__ == "__main__":
    main()
