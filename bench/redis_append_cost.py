#!/usr/bin/env python3
"""Redis's own cost of the Redis engine's append scripts, per message.

    bench/redis_append_cost.py [--messages-per-call M] [--calls N]
                               [--mode volatile|durable|both|append-volatile] [--max-age-ms MS] [--aof]

Assembles the script as the engine does (`#!lua`, helpers.lua, then
append.lua or volatile.lua from crates/herald-redis/src/scripts): `durable`
runs APPEND, `volatile` VOLATILE (the engine's script for volatile messages
without an idempotency key), `append-volatile` the same volatile messages
through APPEND (where the engine sends volatile messages with a key). It starts a private redis-server (no
persistence unless --aof, a Unix socket in a temp dir) under `valgrind --tool=callgrind`,
and sends N EVALSHA calls of M messages each (default 100 x 40), every
message to another of 1,000 channels (point to point: one message per
channel run), 100-byte payloads, no idempotency key, after an untimed first
message to every channel. Instrumentation is on only while the calls run, so
the figure is Redis's instructions per message for reading the command,
running the script and its commands, and writing the reply: repeatable where
timings are not. Also prints the per-command counts Redis saw (INFO
commandstats) for one message.

Needs redis-server and valgrind; nothing else (Python's standard library).
"""
import argparse
import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "crates", "herald-redis", "src", "scripts")


def enc(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rb")

    def send(self, data):
        self.s.sendall(data)

    def read(self):
        line = self.f.readline()
        kind = line[:1]
        if kind == b"-":
            raise RuntimeError(line.decode().strip())
        if kind in (b"+", b":"):
            return line[1:].strip()
        if kind == b"$":
            n = int(line[1:])
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(line[1:]))]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.send(enc(list(args)))
        return self.read()


def run_call(sha, k, per_call, mode, max_age_ms):
    keys, argv = [], ["PUBLISH"] if mode == "volatile" else ["PUBLISH", "e%d" % k]
    for j in range(per_call):
        ch = (k * per_call + j) % 1000
        head = '{"type":"message","channel":"chat:u%d"' % ch
        tail = ',"data":"%s"}' % ("x" * 100)
        msg_id = "m-%d-%d" % (k, j)
        if mode == "volatile":
            # VOLATILE: the meta key; channel, fan, id, the frame around its ts.
            keys.append("herald:{chat:u%d}:meta" % ch)
            argv += ["chat:u%d" % ch, "herald:{chat:u%d}:fan" % ch, msg_id,
                     head + ',"id":"' + msg_id + '","ts":', tail]
            continue
        keys += ["herald:{chat:u%d}:meta" % ch, "herald:{chat:u%d}:log" % ch]
        argv += ["c", "chat:u%d" % ch, "herald:{chat:u%d}:fan" % ch]
        if mode == "durable":
            # Durable, no receipt: the script builds the middle from the id.
            argv += ["d", "1000", str(max_age_ms), head + ',"seq":', msg_id, tail]
        else:
            # Volatile, no receipt: id, the frame up to its ts, the rest.
            argv += ["v", msg_id, head + ',"id":"' + msg_id + '","ts":', tail]
    return enc(["EVALSHA", sha, str(len(keys))] + keys + argv)


def measure(script, per_call, calls, mode, max_age_ms, aof):
    with tempfile.TemporaryDirectory() as tmp:
        out, path = os.path.join(tmp, "callgrind.out"), os.path.join(tmp, "redis.sock")
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=" + out,
             "redis-server", "--port", "0", "--unixsocket", path, "--save", "", "--dir", tmp]
            + (["--appendonly", "yes", "--appendfsync", "always"] if aof else ["--appendonly", "no"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    conn = Conn(path)
                    conn.call("PING")
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                sys.exit("redis-server under valgrind did not start")
            sha = conn.call("SCRIPT", "LOAD", script).decode()
            window = 20

            def send(first, count):
                for start in range(first, first + count, window):
                    ks = range(start, min(first + count, start + window))
                    conn.send(b"".join(run_call(sha, k, per_call, mode, max_age_ms) for k in ks))
                    for _ in ks:
                        conn.read()

            # Untimed: every channel's first message (its meta is created).
            warm = -(-1000 // per_call)
            send(0, warm)
            conn.call("CONFIG", "RESETSTAT")
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], **quiet)
            send(warm, calls)
            subprocess.run(["callgrind_control", "-i", "off", str(server.pid)], **quiet)
            subprocess.run(["callgrind_control", "-d", str(server.pid)], **quiet)
            stats = conn.call("INFO", "commandstats").decode()
            instructions = 0
            for _ in range(50):
                for name in glob.glob(out + "*"):
                    with open(name) as f:
                        for line in f:
                            if line.startswith("totals:"):
                                instructions = max(instructions, int(line.split()[1]))
                if instructions:
                    break
                time.sleep(0.1)
        finally:
            server.terminate()
            server.wait()
    messages = per_call * calls
    counts = {}
    for line in stats.splitlines():
        if line.startswith("cmdstat_") and not line.startswith(("cmdstat_config", "cmdstat_info", "cmdstat_script")):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            calls_of = int(rest.split("calls=")[1].split(",")[0])
            counts[name] = calls_of / messages
    return instructions / messages, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages-per-call", type=int, default=40)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--mode", choices=["volatile", "durable", "both", "append-volatile"], default="both")
    ap.add_argument("--max-age-ms", type=int, default=0,
                    help="durable messages' max_age (history_ttl); 0: none (the default namespace chat has 3 days)")
    ap.add_argument("--aof", action="store_true",
                    help="Redis with appendonly yes, appendfsync always (the writes' propagation counted too)")
    a = ap.parse_args()
    def script(name):
        with open(os.path.join(SCRIPTS, "helpers.lua")) as h, open(os.path.join(SCRIPTS, name)) as b:
            return "#!lua\n" + h.read() + b.read()
    modes = ["volatile", "durable"] if a.mode == "both" else [a.mode]
    for mode in modes:
        name = "VOLATILE" if mode == "volatile" else "APPEND"
        per_msg, counts = measure(script(name.lower() + ".lua"), a.messages_per_call, a.calls, mode,
                                  a.max_age_ms, a.aof)
        commands = ", ".join("%s %.2f" % (k, v) for k, v in sorted(counts.items()) if k != "evalsha")
        age = " max_age %d ms" % a.max_age_ms if mode == "durable" and a.max_age_ms else ""
        age += " AOF always" if a.aof else ""
        print("%-8s %-15s%s %d messages/call: %6.0f Redis instructions/message  (commands/message: %s)"
              % (name, mode, age, a.messages_per_call, per_msg, commands), flush=True)


if __name__ == "__main__":
    main()
