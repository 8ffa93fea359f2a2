#!/usr/bin/env python3
"""Median tables from `herald bench --json` output (one JSON object per line).

    python3 bench/table.py results.jsonl          # every figure, every server
    python3 bench/table.py --hot results.jsonl    # the hot-paths table

Default: one row per figure and parameter set, one column per server
(Herald first), each cell the median over the repetitions that passed
verification, then Herald/peer ratios.

`--hot` (what `bench/run.sh` prints by default): the hot-paths table of
docs/benchmarks.md, Herald on durable `chat:` and volatile `live:` channels
in two columns, then NATS, `ws` and whatever else ran, then Herald/NATS
ratios and the target each figure is judged against. Every row names its
load shape. Cross-node runs (`cross_node`: publisher on node A, subscribers
on node B) get rows of their own and columns of their own: Herald on Redis
(`herald redis chat:`, `herald redis live:`), `nats cluster`, `socketio
redis`, with Herald-on-Redis/peer ratios. The `http201` peer (nginx
answering 201: the HTTP ceiling) is the `nginx 201` column of the HTTP
publish row, with Herald's share of it; the same peer against
`durable_201` (the durable HTTP baseline, known by its `/version`) is the
`durable 201` column, with Herald's share of it and its own share of the
ceiling.

Runs that failed verification are counted, not used. Standard library only.
"""
import json
import statistics
import sys
from collections import OrderedDict, defaultdict

# Other processes using more CPU than this (% of one core) during a run
# disturbed it; such runs are listed under the table.
DISTURBED_PCT = 25

# (scenario, field, label, unit, higher_is_better)
FIGURES = [
    ("idle", "rss_per_conn_kb", "idle RSS per connection", "KB", False),
    ("idle", "server_cpu_pct", "idle server CPU", "%", False),
    ("fanout", "deliveries_per_s", "fan-out deliveries/s", "", True),
    ("fanout", "p50_ms", "fan-out p50", "ms", False),
    ("fanout", "p99_ms", "fan-out p99", "ms", False),
    ("fanout", "server_cpu_pct", "fan-out server CPU", "%", False),
    ("p2p", "deliveries_per_s", "p2p deliveries/s", "", True),
    ("p2p", "p99_ms", "p2p p99", "ms", False),
    ("publish", "publishes_per_s", "publishes/s", "", True),
    ("publish", "p99_ms", "publish p99", "ms", False),
    ("reconnect", "all_resumed_s", "all clients resumed", "s", False),
    ("reconnect", "resume_p99_ms", "resume handshake p99", "ms", False),
    ("acked", "drain_s", "acked: all inboxes drained", "s", False),
    ("acked", "drain_p99_ms", "acked: one inbox drained, p99", "ms", False),
    ("acked", "deliveries_per_s", "acked deliveries/s", "", True),
    ("acked", "p99_ms", "acked p99", "ms", False),
    ("acked", "acks_per_s", "acked: ack frames/s (clients)", "", True),
    ("acked", "server_acks_per_s", "acked: acks/s (server)", "", True),
]


def params(run):
    s = run["scenario"]
    if s == "publish":
        return f"{run.get('publishers')} publishers"
    p = f"{run.get('connections')} conns"
    if run.get("namespace") not in (None, "user"):
        p += f", {run['namespace']}:"
    if s == "fanout":
        p += f", rate {run.get('rate')}"
    if run.get("cross_node"):
        p += ", publisher on another node"
    if s == "acked":
        conns, messages = run.get("connections") or 0, run.get("messages") or 0
        p += f", {messages // max(conns, 1)} msgs each, {run.get('phase')}"
    return p


def fmt(v):
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def main(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    servers = list(OrderedDict.fromkeys(["herald"] + [r["peer"] for r in runs]))
    servers = [s for s in servers if any(r["peer"] == s for r in runs)]
    values = defaultdict(list)  # (scenario, params, field, server) -> [v]
    failed = defaultdict(int)
    # CPU ticks are 10 ms: shorter runs cannot tell.
    disturbed = [
        r for r in runs if (r.get("other_cpu_pct") or 0) > DISTURBED_PCT and r.get("duration_s", 0) >= 2
    ]
    rows = OrderedDict()
    for r in runs:
        key = (r["scenario"], params(r))
        if not r.get("ok", False):
            failed[(key, r["peer"])] += 1
            continue
        for scenario, field, label, unit, better in FIGURES:
            if scenario == r["scenario"] and r.get(field) is not None:
                rows[(scenario, key[1], field)] = (label, unit, better)
                values[(scenario, key[1], field, r["peer"])].append(r[field])

    peers = [s for s in servers if s != "herald"]
    head = ["figure", "params"] + servers + [f"herald/{p}" for p in peers]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    order = {(f[0], f[1]): i for i, f in enumerate(FIGURES)}
    for (scenario, p, field), (label, unit, better) in sorted(
        rows.items(), key=lambda kv: (order[(kv[0][0], kv[0][2])], kv[0][1])
    ):
        cells = [f"{label}" + (f" ({unit})" if unit else ""), p]
        med = {}
        for s in servers:
            vs = values.get((scenario, p, field, s), [])
            if vs:
                med[s] = statistics.median(vs)
                cells.append(f"{fmt(med[s])} (n={len(vs)})")
            else:
                cells.append("–")
        for peer in peers:
            h, o = med.get("herald"), med.get(peer)
            cells.append(f"{h / o:.2f}" if h is not None and o else "–")
        print("| " + " | ".join(cells) + " |")
    if failed:
        print()
        for ((scenario, p), server), n in failed.items():
            print(f"- {n} {scenario} run(s) of {server} ({p}) FAILED verification and are not in the medians")
    if disturbed:
        print()
        for r in disturbed:
            print(f"- disturbed: {r['scenario']} {r['peer']} ({params(r)}, {r.get('label')}): "
                  f"other processes used {r['other_cpu_pct']:.0f}% CPU during the run")
    print()
    print("Ratios: Herald's median divided by the peer's. Higher is better for deliveries/s and publishes/s, "
          "lower is better for memory, CPU, latency and resume time.")


# Cross-node runs: a peer's column names its two-node form (bench/lib.sh's
# nats-cluster and socketio-redis); Herald across nodes is on Redis (the
# embedded engine is one node).
CROSS_NODE_PEERS = {"nats": "nats cluster", "socketio": "socketio redis"}


def column(run):
    """The hot table's column of a run: Herald per namespace, peers by name."""
    cross = run.get("cross_node", False)
    if run["peer"] == "http201":
        # durable_201 says so at /version; nginx says its version.
        server = (run.get("versions") or {}).get("server") or ""
        return "durable 201" if server.startswith("durable_201") else "nginx 201"
    if run["peer"] != "herald":
        return CROSS_NODE_PEERS.get(run["peer"], run["peer"] + " 2-node") if cross else run["peer"]
    wire = {"centrifugo-protobuf": " protobuf", "centrifugo-json": " centrifugo json", "sse": " sse"}.get(
        run.get("wire"), "")
    return f"herald {'redis ' if cross else ''}{run.get('namespace') or 'chat'}:{wire}"


def ratio_pairs(columns):
    """(Herald column, peer column) pairs whose ratio the hot table prints,
    and the durable HTTP baseline's share of the ceiling."""
    pairs = []
    for h in columns:
        if not h.startswith("herald"):
            continue
        if h.startswith("herald redis "):
            pairs += [(h, p) for p in CROSS_NODE_PEERS.values() if p in columns]
        elif "nats" in columns:
            pairs.append((h, "nats"))
    for ceiling in ("nginx 201", "durable 201"):
        if "herald chat:" in columns and ceiling in columns:
            pairs.append(("herald chat:", ceiling))
    if "durable 201" in columns and "nginx 201" in columns:
        pairs.append(("durable 201", "nginx 201"))
    return pairs


def n(v):
    return f"{v:,}" if isinstance(v, int) else str(v)


def hot_rows(run):
    """(row key, label, field, unit, target) for each figure of a run that
    belongs in the hot table; the label names the load shape."""
    s = run["scenario"]
    via = run.get("publish_via")
    conns = run.get("ws_publishers") or 1
    pipelined = (
        f"pipelined over {'one WS connection' if conns == 1 else f'{n(conns)} WS connections'}, "
        f"window {n(run.get('window'))}"
        if via == "ws"
        else "HTTP, one request in flight per publisher"
    )
    size = run.get("size")
    cross = run.get("cross_node", False)
    if cross:
        pipelined = f"two nodes: publisher on A, subscribers on B, {pipelined}"
    if s == "p2p":
        label = (
            f"p2p: {n(run.get('messages'))} × {size} B round-robin to {n(run.get('connections'))} users' "
            f"channels, {pipelined}: deliveries/s"
        )
        yield ("p2p", via, cross, run.get("messages"), run.get("connections")), label, "deliveries_per_s", "", "p2p"
    elif s == "fanout":
        subs, msgs = n(run.get("connections")), n(run.get("messages"))
        if run.get("rate") == "max":
            label = f"fan-out: {subs} subscribers on one channel, {msgs} messages back to back, {pipelined}: deliveries/s"
            key = ("fanout-max", via, cross, run.get("messages"), run.get("connections"))
            yield key, label, "deliveries_per_s", "", "fanout"
        else:
            rate = run.get("rate")
            per_s = float(rate) * (run.get("connections") or 0)
            label = (
                f"fan-out: same subscribers, {msgs} messages at {rate} msg/s (= {per_s:,.0f} deliveries/s), "
                f"{pipelined}: p99 publish → deliver"
            )
            yield ("fanout-rate", via, cross, rate, run.get("connections")), label, "p99_ms", "ms", "fanout-p99"
    elif s == "idle":
        conns = n(run.get("connections"))
        key = ("idle", run.get("connections"))
        yield key + ("kb",), f"idle: {conns} connections, each on its own channel: server RSS per connection", \
            "rss_per_conn_kb", "KB", "idle-kb"
        yield key + ("cpu",), f"idle: {conns} connections: server CPU over the hold", "server_cpu_pct", "%", "idle-cpu"
    elif s == "publish":
        label = (
            f"HTTP publish: {n(run.get('publishers'))} keep-alive connections, one request in flight each, "
            f"one keyed message per request (Idempotency-Key), {size} B: publishes/s"
        )
        yield ("publish", run.get("publishers")), label, "publishes_per_s", "", "http"


# The targets Herald's hot paths are judged against (docs/benchmarks.md),
# as a check on the medians.
# (kind, column) -> (text, needs a NATS median, check(herald, nats)).
TARGETS = {
    ("p2p", "herald live:"): ("≥ 1.0 × NATS", True, lambda h, o: h >= o),
    ("p2p", "herald chat:"): ("≥ 0.6 × NATS and ≥ 100,000", True, lambda h, o: h >= 0.6 * o and h >= 100_000),
    ("fanout", "herald chat:"): ("≥ 1.0 × NATS", True, lambda h, o: h >= o),
    ("fanout", "herald live:"): ("≥ 1.0 × NATS", True, lambda h, o: h >= o),
    ("fanout-p99", "herald chat:"): ("≤ 25 ms", False, lambda h, o: h <= 25),
    ("fanout-p99", "herald live:"): ("≤ 25 ms", False, lambda h, o: h <= 25),
    ("idle-kb", "herald chat:"): ("≤ 3.0 KB", False, lambda h, o: h <= 3.0),
    ("idle-cpu", "herald chat:"): ("≤ 0.3 %", False, lambda h, o: h <= 0.3),
    ("http", "herald chat:"): ("≥ 60,000", False, lambda h, o: h >= 60_000),
}


def ratio(a, b):
    if a is None or not b:
        return "–"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 else f"{r:.3f}"


def hot(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    preferred = [
        "herald chat:", "herald live:", "nats", "ws", "socketio", "socketioxide",
        "herald redis chat:", "herald redis live:", "nats cluster", "socketio redis", "nginx 201", "durable 201",
    ]
    seen = list(OrderedDict.fromkeys(column(r) for r in runs))
    columns = [c for c in preferred if c in seen] + [c for c in seen if c not in preferred]
    heralds = [c for c in columns if c.startswith("herald")]
    values = defaultdict(list)  # (row key, column) -> [v]
    rows = OrderedDict()  # row key -> (label, unit, kind)
    failed = defaultdict(int)
    for r in runs:
        for key, label, field, unit, kind in hot_rows(r):
            if not r.get("ok", False):
                failed[(label, column(r))] += 1
                continue
            if r.get(field) is None:
                continue
            rows.setdefault(key, (label, unit, kind))
            values[(key, column(r))].append(r[field])
    order = ["p2p", "fanout", "fanout-p99", "idle-kb", "idle-cpu", "http"]
    keys = sorted(rows, key=lambda k: (order.index(rows[k][2]), str(k)))
    most = max((len(v) for v in values.values()), default=0)
    pairs = ratio_pairs(columns)
    head = ["figure"] + columns + [f"{h}/{p}" for h, p in pairs] + ["target (Herald)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in keys:
        label, unit, kind = rows[key]
        cells = [label + (f" ({unit})" if unit else "")]
        med = {}
        for c in columns:
            vs = values.get((key, c), [])
            if vs:
                med[c] = statistics.median(vs)
                cells.append(fmt(med[c]) + (f" (n={len(vs)})" if len(vs) < most else ""))
            else:
                cells.append("–")
        for h, p in pairs:
            cells.append(ratio(med.get(h), med.get(p)))
        verdicts = []
        for h in heralds:
            target = TARGETS.get((kind, h))
            if target and h in med:
                text, needs_nats, check = target
                if needs_nats and not med.get("nats"):
                    verdict = "no NATS figure"
                else:
                    verdict = "met" if check(med[h], med.get("nats")) else "not met"
                verdicts.append(f"{h} {text}: {verdict}")
        cells.append("; ".join(verdicts) or "–")
        print("| " + " | ".join(cells) + " |")
    print()
    print("Medians over the repetitions that passed verification. Ratios: Herald's median divided by the peer's "
          "(higher is better for deliveries/s and publishes/s, lower for latency, memory and CPU).")
    if "nginx 201" in columns:
        print("`nginx 201` is the HTTP ceiling: nginx answering the same requests with a fixed 201, "
              "doing nothing else; `herald chat:/nginx 201` is the share of it Herald reaches.")
    if "durable 201" in columns:
        print("`durable 201` is the durable HTTP baseline: each request's body appended to a file and fsynced "
              "(group commit) before the same 201, doing nothing else; `herald chat:/durable 201` is the share "
              "of it Herald reaches.")
    if failed:
        print()
        for (label, c), count in failed.items():
            print(f"- {count} run(s) of {c} FAILED verification and are not in the medians: {label}")
    disturbed = [
        r for r in runs if (r.get("other_cpu_pct") or 0) > DISTURBED_PCT and r.get("duration_s", 0) >= 2
    ]
    if disturbed:
        print()
        others = sorted(r["other_cpu_pct"] for r in disturbed)
        print(f"- disturbed: in {len(disturbed)} of {len(runs)} runs other processes used more than "
              f"{DISTURBED_PCT} % of a core (median {statistics.median(others):.0f} %, max {others[-1]:.0f} %): "
              + ", ".join(f"{r['scenario']} {column(r)} {r.get('rate') or ''} {r.get('label') or ''} "
                          f"{r['other_cpu_pct']:.0f} %".replace("  ", " ") for r in disturbed))


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--hot":
        hot(args[1])
    elif len(args) == 1 and not args[0].startswith("-"):
        main(args[0])
    else:
        sys.exit(__doc__)
