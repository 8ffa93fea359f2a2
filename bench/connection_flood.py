#!/usr/bin/env python3
"""One attacker on one machine against Herald's connection layer.

    python3 bench/connection_flood.py target/release/herald [--heads N] [--pad BYTES] [--silent N]

Starts `herald serve --dev` on a free port with `header_read_timeout = "60s"`
(so that only the HTTP connection cap acts, not the timeouts), then:
opens --heads connections (default 4000) that each send an unfinished
request head of --pad bytes (default 15000) and prints the server's RSS;
then opens --silent more sockets (default 12000) that send nothing, with a
`/healthz` on a new connection every 1000 of them, and prints whether it
answered and how fast, the RSS, and the `herald_http_connections*` metrics.
Prints figures; asserts nothing. Standard library only.
"""
import argparse
import os
import resource
import socket
import subprocess
import tempfile
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("herald")
    ap.add_argument("--heads", type=int, default=4000)
    ap.add_argument("--pad", type=int, default=15000)
    ap.add_argument("--silent", type=int, default=12000)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, "herald.toml")
    with open(cfg, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\ndata_dir = "{tmp}/data"\ndev = true\n'
                '[http]\nheader_read_timeout = "60s"\n')
    srv = subprocess.Popen([args.herald, "serve", "--config", cfg],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss_mib():
        with open(f"/proc/{srv.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024
        return -1

    def get(path):
        t = time.time()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            body = r.read().decode()
            return r.status, (time.time() - t) * 1000, body

    try:
        for _ in range(100):
            try:
                get("/healthz")
                break
            except OSError:
                time.sleep(0.1)
        print(f"baseline RSS: {rss_mib()} MiB")

        heads = []
        partial = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * args.pad
        t = time.time()
        for _ in range(args.heads):
            s = socket.create_connection(("127.0.0.1", port))
            s.setblocking(False)
            try:
                s.send(partial)
            except BlockingIOError:
                pass
            heads.append(s)
        time.sleep(1)
        print(f"{args.heads} unfinished heads of {args.pad} B in {time.time() - t:.1f} s: RSS {rss_mib()} MiB")

        silent, answers = [], []
        t = time.time()
        for i in range(args.silent):
            silent.append(socket.create_connection(("127.0.0.1", port)))
            if i % 1000 == 999:
                status, ms, _ = get("/healthz")
                answers.append((status, ms))
        rate = args.silent / (time.time() - t)
        ok = sum(1 for s, _ in answers if s == 200)
        worst = max((ms for _, ms in answers), default=0)
        print(f"{args.silent} silent sockets at {rate:.0f}/s: /healthz {ok}/{len(answers)} answered 200, "
              f"slowest {worst:.1f} ms; RSS {rss_mib()} MiB")
        _, _, metrics = get("/metrics")
        for line in metrics.splitlines():
            if line.startswith("herald_http_connections"):
                print("  " + line)
        for s in heads + silent:
            s.close()
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
