#!/usr/bin/env bash
# moeserve against llama.cpp on the same GGUF file, by hand (docs/performance.md, "GGUF files"):
# c = 1 decode and a 128-token prefill, each run of `moeserve bench latency` followed by
# llama.cpp's `llama-bench` on the same file, same threads and instruction set, ROUNDS times;
# then the medians and their ratios (scripts/bench_gguf_ratios.py).
#   LLAMA_NATIVE=DIR LLAMA_AVX2=DIR scripts/bench_gguf.sh FILE.gguf [FILE.gguf ...]
# LLAMA_NATIVE / LLAMA_AVX2: the bin folders of llama.cpp builds for this CPU's best target and
# for AVX2 only (built outside this repository; the project never depends on llama.cpp).
# ISAS="native avx2" picks the instruction sets (a missing LLAMA_* skips its ISA), ROUNDS
# (default 3) the alternating rounds, THREADS (default 2), OUT (default /tmp/bench_gguf) the JSON.
# moeserve runs with the file used as stored and --ggml-activations int8 (llama.cpp's
# arithmetic); EXTRA adds flags to moeserve's runs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target moeserve >/dev/null
bin=build/release/cli/moeserve
out=${OUT:-/tmp/bench_gguf}
threads=${THREADS:-2}
mkdir -p "$out"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for isa in ${ISAS:-native avx2}; do
    if [ "$isa" = native ]; then llama=${LLAMA_NATIVE:-}; isa_flag=(); else
      llama=${LLAMA_AVX2:-}; isa_flag=(--isa "$isa"); fi
    [ -n "$llama" ] || { echo "== $isa: no llama.cpp build given, skipped"; continue; }
    for file in "$@"; do
      name=$(basename "$file" .gguf)
      echo "== round $round, $isa, $name: moeserve"
      "$bin" bench latency --model "$file" --threads "$threads" --input-len 128 --output-len 64 \
        --spec none "${isa_flag[@]}" ${EXTRA:-} --json "$out/moeserve_${isa}_${name}_r$round.json" |
        tail -n 1
      echo "== round $round, $isa, $name: llama.cpp"
      "$llama/llama-bench" -m "$file" -t "$threads" -p 128 -n 64 -r 1 -o json \
        >"$out/llama_${isa}_${name}_r$round.json"
    done
  done
done
/usr/bin/python3 scripts/bench_gguf_ratios.py "$out"
