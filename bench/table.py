#!/usr/bin/env python3
"""Median table from `herald bench --json` output (one JSON object per line).

    python3 bench/table.py results.jsonl

One row per figure and parameter set, one column per server (Herald first),
each cell the median over the repetitions that passed verification, then
Herald/peer ratios. Runs that failed verification are counted, not used.
Standard library only.
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
