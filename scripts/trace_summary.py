#!/usr/bin/env python3
"""Summarizes a `--trace FILE` (Chrome-trace JSON): per engine step, where rank 0's time went.

  scripts/trace_summary.py TRACE.json [--min-requests N] [--skip N] [--experts]

For the steps that ran at least N requests (default 1) after the first `--skip` steps (default
5, warm-up), it prints the mean time of each op on rank 0's engine thread (a step's schedule,
forward, sample, propose and update; inside the forward, the layers' ops summed per step), the
joins per step (thread-pool loops that a worker took part in), and the fixed cost of a step: its
time outside the model's forward (scheduling, sampling, bookkeeping) -- the number issue 18's
target of 0.15 ms is about.

--experts adds, per size of forward (its tokens: 1 + K for a verify step at batch 1) and for the
MTP head's passes, the mean time and the routed experts read per MoE layer -- a step reads the
union of its tokens' choices (issue #37: what a verify step of 1 + K tokens costs in bytes).
"""
import argparse
import collections
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--min-requests", type=int, default=1)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--experts", action="store_true")
    a = p.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    engine = [k for k, name in lanes.items() if name == "rank 0 engine"]
    if not engine:
        sys.exit("no 'rank 0 engine' lane: was the trace written by a command that steps the engine?")
    pid, tid = engine[0]
    spans = [e for e in events if e["ph"] == "X"]
    mine = sorted((e for e in spans if (e["pid"], e["tid"]) == (pid, tid)), key=lambda e: e["ts"])
    steps = [e for e in mine if e["name"] == "step" and e.get("args", {}).get("requests", 0) >= a.min_requests]
    steps = steps[a.skip:]
    if not steps:
        sys.exit("no steps left after --skip / --min-requests")
    workers = sorted((e for e in spans if (e["pid"], e["tid"]) != (pid, tid) and e["pid"] == pid
                      and "worker" in lanes.get((e["pid"], e["tid"]), "")), key=lambda e: e["ts"])
    total = collections.defaultdict(float)
    count = collections.defaultdict(int)
    joins = 0
    j = 0
    for s in steps:
        begin, end = s["ts"], s["ts"] + s["dur"]
        for e in mine:
            if e is not s and begin <= e["ts"] and e["ts"] + e["dur"] <= end + 1e-3:
                total[e["name"]] += e["dur"]
                count[e["name"]] += 1
        while j < len(workers) and workers[j]["ts"] < begin:
            j += 1
        k = j
        while k < len(workers) and workers[k]["ts"] < end:
            joins += 1
            k += 1
    n = len(steps)
    step_us = sum(s["dur"] for s in steps) / n
    print(f"{n} steps (>= {a.min_requests} requests, first {a.skip} skipped): {step_us / 1000:.3f} ms per step")
    print(f"{'op (rank 0 engine thread)':<32} {'per step ms':>12} {'calls/step':>11} {'share':>7}")
    for name in sorted(total, key=lambda k: -total[k]):
        print(f"{name:<32} {total[name] / n / 1000:>12.4f} {count[name] / n:>11.1f} {100 * total[name] / n / step_us:>6.1f}%")
    fixed = step_us - total.get("forward", 0.0) / n
    print(f"fixed cost per step (step - forward): {fixed / 1000:.4f} ms")
    print(f"worker shares of parallel loops per step (rank 0): {joins / n:.1f}")
    if a.experts:
        print_experts(steps, mine)


def print_experts(steps, mine):
    """Per forward size (tokens) and per MTP pass size: mean ms and experts read per MoE layer."""
    moe = ("routed_experts", "experts_and_shared")
    rows = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # (op, tokens) -> calls, us, experts, layers
    for s in steps:
        begin, end = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in mine if begin <= e["ts"] and e["ts"] + e["dur"] <= end + 1e-3]
        for op in (e for e in inside if e["name"] in ("forward", "mtp")):
            key = (op["name"], op.get("args", {}).get("tokens", 0))
            row = rows[key]
            row[0] += 1
            row[1] += op["dur"]
            for e in inside:
                if e["name"] in moe and op["ts"] <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1e-3:
                    row[2] += e.get("args", {}).get("experts", 0)
                    row[3] += 1
    print(f"{'op':<8} {'tokens':>6} {'calls':>6} {'ms each':>8} {'experts read per MoE layer':>27}")
    for (name, tokens), (calls, us, experts, layers) in sorted(rows.items()):
        per_layer = f"{experts / layers:.2f}" if layers else "-"
        print(f"{name:<8} {tokens:>6} {calls:>6} {us / calls / 1000:>8.3f} {per_layer:>27}")


if __name__ == "__main__":
    main()
