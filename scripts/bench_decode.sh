#!/usr/bin/env bash
# docs/performance.md's decode / prefill tables on both instruction sets and every weight format:
# `bench latency` (bandwidth measured in the same run) for each --isa x --weight-dtype, then the
# ablation at batch 1 on each instruction set: on MODEL_DIR (random weights: an MTP head there
# drafts nothing useful, so --spec none) and on the default model with its trained MTP head.
#   scripts/bench_decode.sh [MODEL_DIR] [BATCH_SIZES]
# MODEL_DIR defaults to the bench preset in /tmp/bench (made if missing), BATCH_SIZES to 1,4,8.
# ISAS="native avx2" (native: the best target this CPU runs, e.g. avx3_dl) and
# DTYPES="bf16 int8 int4 w8a8 w4a8" choose the rows (WEIGHT/LM_HEAD, e.g. int4/int4, sets
# --lm-head-dtype too); OUT (default /tmp) gets the JSON and, for the ablations, bench latency's
# HTML reports; ABLATION=0 skips the ablations; EXTRA adds flags to every run; ROUNDS=N (default
# 1) repeats the rows N times, alternating, each round's JSON apart (..._rN.json), and
# scripts/bench_medians.py OUT/bench_*_r*.json prints their medians. The real shapes: MODEL_DIR
# from `moeserve make-model --preset qwen3-30b-a3b --num-layers 8 --out DIR` (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target moeserve >/dev/null
bin=build/release/cli/moeserve
model=${1:-/tmp/bench}
batches=${2:-1,4,8}
out=${OUT:-/tmp}
[ -f "$model/config.json" ] || "$bin" make-model --preset bench --out "$model"
rounds=${ROUNDS:-1}
for round in $(seq 1 "$rounds"); do
  for isa in ${ISAS:-native avx2}; do
    isa_flag=()
    [ "$isa" = native ] || isa_flag=(--isa "$isa")
    for row in ${DTYPES:-bf16 int8 int4 w8a8 w4a8}; do
      dtype=${row%%/*}
      flags=(--weight-dtype "$dtype")
      [ "$row" = "$dtype" ] || flags+=(--lm-head-dtype "${row#*/}")
      name="$out/bench_${isa}_${row//\//-lm-}"
      [ "$rounds" = 1 ] || name+="_r$round"
      echo "== $isa ${flags[*]} (round $round of $rounds)"
      "$bin" bench latency --model "$model" --batch-size "$batches" --input-len 128 \
        --output-len 64 --spec none "${isa_flag[@]}" "${flags[@]}" ${EXTRA:-} --json "$name.json"
    done
  done
done
for isa in ${ISAS:-native avx2}; do
  isa_flag=()
  [ "$isa" = native ] || isa_flag=(--isa "$isa")
  [ "${ABLATION:-1}" = 1 ] || continue
  echo "== $isa ablation"
  "$bin" bench latency --model "$model" --batch-size 1,8 --input-len 128 --output-len 64 \
    --spec none "${isa_flag[@]}" --ablation --json "$out/bench_${isa}_ablation.json" \
    --report "$out/bench_${isa}_ablation.html"
  echo "== $isa ablation, default model, --spec mtp:1"
  "$bin" bench latency --batch-size 1,8 --input-len 128 --output-len 128 "${isa_flag[@]}" \
    --spec mtp:1 --ablation --json "$out/bench_${isa}_ablation_default.json" \
    --report "$out/bench_${isa}_ablation_default.html"
done
