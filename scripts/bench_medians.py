#!/usr/bin/env python3
"""Medians of repeated `bench latency --json` runs (scripts/bench_decode.sh with ROUNDS=N).

  scripts/bench_medians.py OUT/bench_*_r*.json [--base int8]

Groups the files by (ISA, weight dtype, lm_head dtype) and prints, per batch size, the median
of each run's TPOT, decode rate, ratio to the single-sequence roofline, prefill rate and ratio
to the FMA peak (both ceilings measured in the same run as the rate), with the smallest and
largest beside the median: the spread says how noisy the machine was. Then the aggregate decode
rate of each batch size over batch 1's, and each row's TPOT against the --base dtype's on the
same ISA and batch (e.g. int4 against int8).
"""
import argparse
import collections
import json
import statistics


def spread(values, fmt):
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return (fmt + " ({}-{})").format(med, fmt.format(min(values)), fmt.format(max(values)))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--base", default="int8", help="weight dtype the TPOT ratios are against")
    args = p.parse_args()

    # (isa, weight, lm_head) -> batch -> list of runs (one per file)
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    ceilings = collections.defaultdict(list)
    for path in args.files:
        with open(path) as f:
            d = json.load(f)
        key = (d["isa"], d["weight_dtype"], d.get("lm_head_dtype", "?"))
        ceilings[key].append((d["bandwidth_gbs"], d["fma_peak_gflops"], d["bytes_per_token"]))
        for run in d["runs"]:
            rows[key][run["batch_size"]].append(run)

    print("| ISA | weights | lm_head | batch | n | TPOT ms | decode tok/s | roofline | "
          "prefill tok/s | FMA peak | aggregate / b1 | TPOT / " + args.base + " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows):
        isa, weight, lm_head = key
        b1 = statistics.median(r["decode_tok_s"] for r in rows[key].get(1, [])) \
            if 1 in rows[key] else None
        base = next((k for k in rows if k[0] == isa and k[1] == args.base), None)
        for batch in sorted(rows[key]):
            runs = rows[key][batch]
            tpot = statistics.median(r["tpot_ms"] for r in runs)
            decode = statistics.median(r["decode_tok_s"] for r in runs)
            vs_b1 = f"{decode / b1:.2f}" if b1 else "-"
            vs_base = "-"
            if base is not None and batch in rows[base]:
                vs_base = f"{tpot / statistics.median(r['tpot_ms'] for r in rows[base][batch]):.2f}"
            print(f"| {isa} | {weight} | {lm_head} | {batch} | {len(runs)} | "
                  f"{spread([r['tpot_ms'] for r in runs], '{:.2f}')} | {decode:.1f} | "
                  f"{spread([r['roofline_ratio'] for r in runs], '{:.2f}')} | "
                  f"{statistics.median(r['prefill_tok_s'] for r in runs):.0f} | "
                  f"{spread([r['prefill_peak_ratio'] for r in runs], '{:.2f}')} | "
                  f"{vs_b1} | {vs_base} |")
    print()
    for key in sorted(ceilings):
        bw = [c[0] for c in ceilings[key]]
        peak = [c[1] for c in ceilings[key]]
        print(f"{' '.join(key)}: bytes/token {ceilings[key][0][2] / 1e6:.1f} MB, read "
              f"{spread(bw, '{:.1f}')} GB/s, FMA peak {spread(peak, '{:.0f}')} GFLOP/s")


if __name__ == "__main__":
    main()
