#!/usr/bin/env python3
"""Medians and ratios of scripts/bench_gguf.sh's alternating runs.

  scripts/bench_gguf_ratios.py OUT

Reads OUT/moeserve_<isa>_<file>_r<N>.json (`bench latency --json`) and
OUT/llama_<isa>_<file>_r<N>.json (`llama-bench -o json`), and prints per ISA and file the median
(with the smallest and largest) of c = 1 decode tokens/s and 128-token prefill tokens/s of each,
moeserve's over llama.cpp's, and moeserve's decode against the roofline of its own runs.
"""
import collections
import glob
import json
import os
import re
import statistics
import sys


def spread(values):
    med = statistics.median(values)
    return f"{med:7.1f} ({min(values):.1f}-{max(values):.1f})"


def main():
    out = sys.argv[1]
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in sorted(glob.glob(os.path.join(out, "*_r*.json"))):
        m = re.match(r"(moeserve|llama)_([a-z0-9_]+?)_(.+)_r\d+\.json$", os.path.basename(path))
        if not m:
            continue
        who, isa, name = m.groups()
        with open(path) as f:
            data = json.load(f)
        key = (isa, name)
        if who == "moeserve":
            run = data["runs"][0]
            runs[key]["ms_decode"].append(run["decode_tok_s"])
            runs[key]["ms_prefill"].append(run["prefill_tok_s"])
            runs[key]["ms_roofline"].append(run["roofline_ratio"])
        else:
            for test in data:
                if test["n_gen"] > 0 and test["n_prompt"] == 0:
                    runs[key]["lc_decode"].append(test["avg_ts"])
                elif test["n_prompt"] > 0 and test["n_gen"] == 0:
                    runs[key]["lc_prefill"].append(test["avg_ts"])
    print(f"{'isa':8} {'file':24} {'what':8} {'moeserve t/s':>22} {'llama.cpp t/s':>22} "
          f"{'ratio':>6} {'roofline':>8}")
    for (isa, name), r in sorted(runs.items()):
        for what in ("decode", "prefill"):
            ms, lc = r[f"ms_{what}"], r[f"lc_{what}"]
            if not ms or not lc:
                continue
            ratio = statistics.median(ms) / statistics.median(lc)
            roof = f"{statistics.median(r['ms_roofline']):8.2f}" if what == "decode" else ""
            print(f"{isa:8} {name:24} {what:8} {spread(ms):>22} {spread(lc):>22} {ratio:6.2f} "
                  f"{roof}")


if __name__ == "__main__":
    main()
