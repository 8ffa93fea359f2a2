#!/usr/bin/env python3
"""A deploy, measured: two nodes on one Redis, SIGTERM to one of them.

    python3 bench/drain.py target/release/herald [--conns 14000] [--procs 4]
        [--channels 100] [--drain-period 15s] [--publish-every 1.0]

Starts a Redis (`redis-server` on a free port, no persistence) and two
nodes, A and B, `herald serve --dev --engine redis`. Opens --conns
WebSockets to A from --procs client processes (the open-files cap is per
process), each subscribed to one of --channels channels, while a publisher
sends one message to every channel every --publish-every seconds
(default 1) through B
(`POST /api/v1/messages`). Then SIGTERM to A: each client, on its close,
reconnects to B at once and subscribes with `since` = the last seq it
received. After A has exited and a few more seconds of publishing, the
publisher stops and every client reads up to the channel's head.

Prints: the closes per second A's drain spread (the reconnects B saw),
the longest gap a client had (close received to its resumed subscribe's
`ok`), and whether every client received every seq from its first one to
the head, none missing (duplicates counted apart). Asserts nothing.
Standard library only; a small WebSocket client is below. A node's
WebSocket cap is fitted to its open-files limit (about 14,900 at 20,000),
so --conns stays under that for B to take them all. The client processes'
timings include their own event-loop lag: run it on an otherwise idle
machine.
"""
import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

API_KEY = "bench-drain-api-key-0123456789"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --- a minimal WebSocket client (text frames, close, ping) ------------------


class Ws:
    def __init__(self, reader, writer):
        self.r, self.w = reader, writer

    @classmethod
    async def connect(cls, port, user):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws?user={user} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
        return cls(reader, writer)

    def send(self, obj, opcode=1):
        data = json.dumps(obj).encode() if opcode == 1 else obj
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.w.write(head + mask + body)

    async def recv(self):
        """('text', obj) or ('close', code) or ('eof', None)."""
        while True:
            try:
                b0, b1 = await self.r.readexactly(2)
                n = b1 & 0x7F
                if n == 126:
                    (n,) = struct.unpack("!H", await self.r.readexactly(2))
                elif n == 127:
                    (n,) = struct.unpack("!Q", await self.r.readexactly(8))
                payload = await self.r.readexactly(n)
            except (asyncio.IncompleteReadError, ConnectionError):
                return ("eof", None)
            op = b0 & 0x0F
            if op == 1:
                return ("text", json.loads(payload))
            if op == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                return ("close", code)
            if op == 9:
                self.send(payload, opcode=10)

    def close(self):
        self.w.close()


# --- one client -----------------------------------------------------------


async def client(i, args, ports, out):
    """Subscribe on A; on A's close, reconnect to B at once and resume.
    `out` is filled as it goes: seqs, closes, gap."""
    channel = f"drain:{i % args.channels}"
    port_a, port_b = ports
    out["channel"], out["seqs"], out["closes"], out["gap"] = channel, [], [], None
    seqs, closes, epoch = out["seqs"], out["closes"], None
    ws = await Ws.connect(port_a, f"u{i}")
    ws.send({"type": "subscribe", "req": 1, "channel": channel})
    moved = False
    try:
        while True:
            kind, v = await ws.recv()
            if kind == "text":
                if v.get("type") == "ok" and v.get("req") == 1:
                    epoch = v.get("epoch")
                    if moved and out["gap"] is None:
                        out["gap"] = time.time() - closes[-1][1]
                elif v.get("type") == "message":
                    seqs.append(v["seq"])
                continue
            closes.append((v, time.time()))
            ws.close()
            if moved:
                return  # B closed too: the bench is over
            moved = True
            while True:
                try:
                    ws = await Ws.connect(port_b, f"u{i}")
                    break
                except (ConnectionError, OSError, asyncio.IncompleteReadError):
                    await asyncio.sleep(0.05)
            since = {"seq": seqs[-1], "epoch": epoch} if seqs else None
            ws.send({"type": "subscribe", "req": 1, "channel": channel, **({"since": since} if since else {})})
    finally:
        ws.close()


def client_proc(idx, args, ports, conns, q, heads_q):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def run():
        outs = [{} for _ in conns]
        tasks = []
        for k, i in enumerate(conns):
            tasks.append(asyncio.create_task(client(i, args, ports, outs[k])))
            if k % 200 == 199:
                await asyncio.sleep(0.05)
        q.put(("ready", idx))
        loop = asyncio.get_running_loop()
        heads = await loop.run_in_executor(None, heads_q.get)

        def at_head(o):
            return bool(o.get("seqs")) and o["seqs"][-1] >= heads.get(o["channel"], 0)

        deadline = time.time() + 60
        while time.time() < deadline and not all(at_head(o) for o in outs):
            await asyncio.sleep(0.2)
        res = [{"i": conns[k], "seqs": o.get("seqs"), "closes": o.get("closes", []), "gap": o.get("gap"),
                "finished": at_head(o)} for k, o in enumerate(outs)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        q.put(("result", res))

    asyncio.run(run())


# --- servers ----------------------------------------------------------------


def start_node(herald, tmp, name, port, redis_port, drain):
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    env = dict(os.environ, HERALD_API_KEYS=API_KEY, HERALD_LOG="warn", HERALD_DRAIN_PERIOD=drain)
    env.pop("HERALD_CONFIG", None)
    cfg = os.path.join(tmp, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write("[websocket]\nmax_connections = 100000\n"
                "[namespaces.drain]\ndelivery = \"durable\"\n")
    p = subprocess.Popen(
        [herald, "serve", "--dev", "--engine", "redis", "--redis-url", f"redis://127.0.0.1:{redis_port}",
         "--listen", f"127.0.0.1:{port}", "--config", cfg],
        env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
    )
    line = p.stdout.readline().decode()
    assert line.startswith("herald listening"), f"{name} did not start: see {tmp}/{name}.log"
    return p


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("herald")
    ap.add_argument("--conns", type=int, default=14000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--channels", type=int, default=100)
    ap.add_argument("--drain-period", default="15s")
    ap.add_argument("--publish-every", type=float, default=1.0, help="seconds between two messages on a channel")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = tempfile.mkdtemp(prefix="herald-drain-")
    redis_port, port_a, port_b = free_port(), free_port(), free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no",
                              "--maxclients", "50000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs, a, b = [], None, None
    try:
        time.sleep(0.5)
        a = start_node(args.herald, tmp, "a", port_a, redis_port, args.drain_period)
        b = start_node(args.herald, tmp, "b", port_b, redis_port, args.drain_period)
        channels = [f"drain:{c}" for c in range(args.channels)]
        q, heads_qs = multiprocessing.Queue(), []
        for p in range(args.procs):
            conns = list(range(p, args.conns, args.procs))
            hq = multiprocessing.Queue()
            heads_qs.append(hq)
            pr = multiprocessing.Process(target=client_proc, args=(p, args, (port_a, port_b), conns, q, hq))
            pr.start()
            procs.append(pr)
        for _ in procs:
            assert q.get(timeout=600)[0] == "ready"
        # Every client is connected and subscribed (give the last ones a moment).
        time.sleep(2)
        print(f"{args.conns} connections on A, {args.channels} channels; a message on each every {args.publish_every} s through B")
        stop_pub = [False]
        heads = {}

        def publisher():
            n = 0
            while not stop_pub[0]:
                r = post(port_b, "/api/v1/messages", {"messages": [{"channel": c, "data": n} for c in channels]})
                for c, res in zip(channels, r.get("results", [])):
                    if isinstance(res, dict) and "seq" in res:
                        heads[c] = max(heads.get(c, 0), res["seq"])
                n += 1
                time.sleep(args.publish_every)

        import threading
        pub = threading.Thread(target=publisher)
        pub.start()
        time.sleep(2)
        t0 = time.time()
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=600)
        t_exit = time.time()
        time.sleep(3)
        stop_pub[0] = True
        pub.join()
        for hq in heads_qs:
            hq.put(dict(heads))
        results = []
        for _ in procs:
            kind, res = q.get(timeout=120)
            results += res
        report(results, t0, t_exit, args)
    finally:
        for pr in procs:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.kill()
        for p in (a, b):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        redis.kill()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def report(results, t0, t_exit, args):
    first_close = [r["closes"][0] for r in results if r["closes"]]
    codes = {}
    for code, _ in first_close:
        codes[code] = codes.get(code, 0) + 1
    per_sec = {}
    for _, t in first_close:
        s = int(t - t0)
        per_sec[s] = per_sec.get(s, 0) + 1
    gaps = sorted(r["gap"] for r in results if r["gap"] is not None)
    missing = dup = complete = 0
    for r in results:
        seqs = r["seqs"] or []
        if not seqs:
            continue
        want = set(range(seqs[0], max(seqs) + 1))
        got = set(seqs)
        missing += len(want - got)
        dup += len(seqs) - len(got)
        complete += not (want - got)
    print(f"SIGTERM to A: exited after {t_exit - t0:.1f} s (drain_period {args.drain_period})")
    print(f"close codes: {codes}")
    print("closes (= reconnects to B) per second after the SIGTERM:")
    for s in sorted(per_sec):
        print(f"  {s:3d}s {per_sec[s]:6d}")
    if per_sec:
        print(f"  peak {max(per_sec.values())}/s, mean {len(first_close) / max(1, len(per_sec)):.0f}/s over {len(per_sec)} s")
    if gaps:
        print(f"gap (close to resumed ok): max {gaps[-1] * 1000:.0f} ms, p99 {gaps[int(len(gaps) * 0.99) - 1] * 1000:.0f} ms, "
              f"median {gaps[len(gaps) // 2] * 1000:.0f} ms")
    print(f"resumed: {len(gaps)}/{len(results)}; finished reading to the head: {sum(r['finished'] for r in results)}")
    print(f"every seq from the first to the last: {complete}/{len(results)} clients; missing {missing}, duplicates {dup}")


if __name__ == "__main__":
    main()
