#!/usr/bin/env bash
# The --tp / --ep benchmarks of docs/performance.md, by hand (minutes on 2 cores):
#   scripts/bench_parallel.sh [MODEL_DIR] [OUT_DIR]
# MODEL_DIR defaults to a bench preset made by make-model in /tmp/moeserve-bench. Each run is
# `moeserve bench latency` (its JSON kept in OUT_DIR); a summary table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/release/cli/moeserve
MODEL=${1:-/tmp/moeserve-bench}
OUT=${2:-/tmp/moeserve-bench-parallel}
mkdir -p "$OUT"
[[ -f "$MODEL/config.json" ]] || "$BIN" make-model --preset bench --out "$MODEL"
LINK=${LINK:-5,10}  # --comm-sim: 5 us, 10 GB/s
COMMON="--model $MODEL --input-len 64 --output-len 24 --spec none"

run() {  # name, flags...
  local name=$1; shift
  echo "== $name: $*" >&2
  "$BIN" bench latency $COMMON --json "$OUT/$name.json" "$@" 2>/dev/null | tail -n +6 >&2
}

run tp1 --tp 1 --threads 2 --batch-size 1,4,8
run tp2 --tp 2 --threads 1 --batch-size 1,4,8
run tp2-unfused --tp 2 --threads 1 --batch-size 1,4,8 --no-fused-allreduce-norm
run tp2-ep-allgather --tp 2 --ep --threads 1 --batch-size 1,8
run tp2-ep-mc2 --tp 2 --ep --threads 1 --batch-size 1,8 --mc2-max-tokens 64
for ep in 2 4 8; do
  for mode in mc2 plain; do
    flag=""; [[ $mode == plain ]] && flag="--no-mc2"
    run "sim-ep$ep-$mode" --tp "$ep" --ep --threads 1 --batch-size 1,8 --mc2-max-tokens 64 \
      --comm-sim "$LINK" $flag
  done
done

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'run':<22} {'batch':>5} {'TPOT ms':>8} {'decode t/s':>11} {'link ms':>8} {'exposed':>8} {'a2a exp.':>8}")
for name in sorted(os.listdir(out)):
    if not name.endswith('.json'): continue
    j = json.load(open(os.path.join(out, name)))
    for r in j['runs']:
        print(f"{name[:-5]:<22} {r['batch_size']:>5} {r['tpot_ms']:>8.2f} {r['decode_tok_s']:>11.1f} "
              f"{r['link_ms_per_step']:>8.3f} {r['link_exposed_ms_per_step']:>8.3f} {r['a2a_exposed_ms_per_step']:>8.3f}")
PY
