#!/usr/bin/env bash
# docs/performance.md's speculative-decoding figures on bandwidth-bound models (issue #37):
# the default model (trained MTP head) and copies of it whose routed experts are R times as wide
# (`make-model --inflate-from`: the same function, R times the expert bytes per token), at c = 1.
#   1. TPOT of `bench latency --batch-size 1 --input-len 128 --output-len OUT` for each --spec in
#      SPECS, alternating, ROUNDS rounds, medians; fixed K drafts exactly K
#      (--spec-min-acceptance 0); acceptance per position of mtp:3;
#   2. one traced run each of none and mtp:3: per forward size (1 + K tokens) the step's time and
#      the routed experts it read per MoE layer (scripts/trace_summary.py --experts).
#   scripts/bench_spec.sh [FACTOR|MODEL_DIR...]   (default: 16 64 256; 1 is the default model;
#   a folder is used as it is, e.g. a random-weight model whose MTP head never guesses right)
# Inflated models are written to INFLATED_DIR (default /tmp/moeserve-inflated; R = 256 is 7 GB).
# ROUNDS (default 3), OUT (default 128), SPECS (default "none mtp:1 mtp:2 mtp:3 ngram:3
# mtp:auto"), EXTRA (flags for every run, e.g. --isa avx2).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target moeserve >/dev/null
bin=build/release/cli/moeserve
rounds=${ROUNDS:-3}
out=${OUT:-128}
specs=${SPECS:-none mtp:1 mtp:2 mtp:3 ngram:3 mtp:auto}
inflated=${INFLATED_DIR:-/tmp/moeserve-inflated}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

factors=("$@")
[ ${#factors[@]} -gt 0 ] || factors=(16 64 256)
for r in "${factors[@]}"; do
  model=models/default
  if [ -d "$r" ]; then
    model=$r
    r=$(basename "$r")
  elif [ "$r" != 1 ]; then
    model=$inflated/r$r
    [ -f "$model/config.json" ] ||
      "$bin" make-model --inflate-from models/default --inflate-factor "$r" --out "$model" >/dev/null
  fi
  run() {  # run SPEC JSON [flags]
    local spec=$1 json=$2
    shift 2
    local fixed=()
    case "$spec" in *:[0-9]) fixed=(--spec-min-acceptance 0) ;; esac
    "$bin" bench latency --model "$model" --batch-size 1 --input-len 128 --output-len "$out" \
      --spec "$spec" "${fixed[@]}" --json "$json" ${EXTRA:-} "$@" >/dev/null 2>"$work/err" ||
      { cat "$work/err"; exit 1; }
  }
  for round in $(seq 1 "$rounds"); do
    for spec in $specs; do run "$spec" "$work/r$r-${spec/:/_}-$round.json"; done
  done
  for spec in none mtp:3; do
    run "$spec" "$work/trace.json.out" --trace "$work/trace-$r-${spec/:/_}.json"
    python3 scripts/trace_summary.py "$work/trace-$r-${spec/:/_}.json" --experts |
      sed -n '/^op  /,$p' >"$work/experts-$r-${spec/:/_}.txt"
  done
  python3 - "$work" "$r" "$rounds" "$specs" <<'PY'
import json, statistics, sys
work, r, rounds, specs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
runs = {s: [json.load(open(f"{work}/r{r}-{s.replace(':', '_')}-{k}.json")) for k in range(1, rounds + 1)]
        for s in specs}
tpot = {s: statistics.median(j["runs"][0]["tpot_ms"] for j in runs[s]) for s in specs}
first = runs[specs[0]][0]
print(f"\n## {'R = ' + r if r.isdigit() else r}: {first['bytes_per_token'] / 1e6:.0f} MB read per token, "
      f"{first['isa']}, read bandwidth {first['bandwidth_gbs']:.1f} GB/s; "
      f"TPOT medians of {rounds} alternating runs")
base = tpot.get("none")
for s in specs:
    spec = runs[s][-1]["runs"][0]["spec"]
    ratio = f" ({tpot[s] / base:.2f}x none)" if base and s != "none" else ""
    acc = ""
    if spec["num_drafts"] > 0:
        per = [n / spec["num_drafts"] for n in spec["num_accepted_tokens_per_pos"]]
        acc = (f"; acceptance length {spec['mean_acceptance_length']:.2f}, accepted per position "
               + " ".join(f"{p:.2f}" for p in per) + f", {spec['num_draft_tokens']} drafts")
    print(f"  {s:<9} {tpot[s]:8.3f} ms{ratio}{acc}   (runs: "
          + ", ".join(f"{j['runs'][0]['tpot_ms']:.3f}" for j in runs[s]) + ")")
for s in ("none", "mtp_3"):
    print(f"  trace, {s.replace('_', ':')}:")
    for line in open(f"{work}/experts-{r}-{s}.txt"):
        print("    " + line.rstrip())
PY
done
