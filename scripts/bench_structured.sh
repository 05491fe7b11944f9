#!/usr/bin/env bash
# docs/performance.md's structured-output figures:
#   1. structured_benchmark over structured/testdata/schemas.jsonl (compile, mask per token cold
#      and warm; one thread, the real Qwen3 vocabulary);
#   2. TPOT of constrained against plain requests on a model, at each concurrency: `generate`
#      with C copies of one prompt, 128 tokens each, plain (ignore_eos) and under a JSON Schema
#      that runs to the length limit, alternating, ROUNDS rounds (default 5); prints the medians
#      of the per-run mean TPOT and their ratio.
#   scripts/bench_structured.sh [MODEL_DIR] [CONCURRENCIES]
# MODEL_DIR defaults to the default model, CONCURRENCIES to "1 8"; EXTRA adds flags to every
# generate (e.g. --isa avx2).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target moeserve structured_benchmark >/dev/null
bin=build/release/cli/moeserve
model_flag=()
[ -z "${1:-}" ] || model_flag=(--model "$1")
rounds=${ROUNDS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build/release/structured/structured_benchmark structured/testdata/schemas.jsonl 4 |
  sed -n '1p;/^all:/,$p'

schema='{"type": "object", "properties": {"verses": {"type": "array", "items": {"type": "string"}, "minItems": 64}}, "required": ["verses"]}'
for c in ${2:-1 8}; do
  : >"$work/plain.jsonl"
  : >"$work/constrained.jsonl"
  for i in $(seq 1 "$c"); do
    echo "{\"prompt\": \"In the beginning\", \"max_tokens\": 128, \"ignore_eos\": true, \"seed\": $i, \"temperature\": 0.8}" >>"$work/plain.jsonl"
    echo "{\"prompt\": \"In the beginning\", \"max_tokens\": 128, \"seed\": $i, \"temperature\": 0.8, \"guided_json\": $schema}" >>"$work/constrained.jsonl"
  done
  for round in $(seq 1 "$rounds"); do
    for kind in plain constrained; do
      "$bin" generate "${model_flag[@]}" --prompts-file "$work/$kind.jsonl" --max-num-seqs "$c" \
        --json ${EXTRA:-} >"$work/$kind-$round.json"
    done
  done
  python3 - "$work" "$rounds" "$c" <<'EOF'
import json, statistics, sys
work, rounds, c = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = {}
for kind in ("plain", "constrained"):
    runs = []
    for r in range(1, rounds + 1):
        reqs = json.load(open(f"{work}/{kind}-{r}.json"))["requests"]
        tokens = sum(len(q["token_ids"]) for q in reqs) / len(reqs)
        runs.append(statistics.mean(q["tpot_ms"] for q in reqs))
    med[kind] = statistics.median(runs)
    print(f"c = {c}: {kind:11s} TPOT median {med[kind]:.3f} ms (runs {', '.join(f'{x:.3f}' for x in runs)}; "
          f"{tokens:.0f} tokens per request)")
print(f"c = {c}: constrained / plain = {med['constrained'] / med['plain']:.3f}")
EOF
done
