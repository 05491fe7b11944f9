#!/usr/bin/env bash
# docs/performance.md's structured-output figures:
#   1. structured_benchmark over structured/testdata/schemas.jsonl (compile, mask per token cold
#      and warm; one thread, the real Qwen3 vocabulary);
#   2. constrained against plain requests on a model, at each concurrency: `generate` with C
#      copies of one prompt, 256 tokens each, plain (ignore_eos) and under a JSON Schema that runs
#      to the length limit, alternating, ROUNDS rounds (default 7), each with --trace; prints the
#      medians over the runs of the engine step's time and of its "sample" op (where the grammar's
#      mask is made and applied), from scripts/trace_summary.py, and their ratios.
#   scripts/bench_structured.sh [MODEL_DIR] [CONCURRENCIES]
# MODEL_DIR defaults to the default model ("" too), CONCURRENCIES to "1 8"; EXTRA adds flags to
# every generate (e.g. --isa avx2).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target moeserve structured_benchmark >/dev/null
bin=build/release/cli/moeserve
model_flag=()
[ -z "${1:-}" ] || model_flag=(--model "$1")
rounds=${ROUNDS:-7}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build/release/structured/structured_benchmark structured/testdata/schemas.jsonl 4 |
  sed -n '1p;/^all:/,$p'

schema='{"type": "object", "properties": {"verses": {"type": "array", "items": {"type": "string"}, "minItems": 64}}, "required": ["verses"]}'
for c in ${2:-1 8}; do
  : >"$work/plain.jsonl"
  : >"$work/constrained.jsonl"
  for i in $(seq 1 "$c"); do
    line="\"prompt\": \"In the beginning\", \"max_tokens\": 256, \"seed\": $i, \"temperature\": 0.8"
    echo "{$line, \"ignore_eos\": true}" >>"$work/plain.jsonl"
    echo "{$line, \"guided_json\": $schema}" >>"$work/constrained.jsonl"
  done
  for round in $(seq 1 "$rounds"); do
    for kind in plain constrained; do
      "$bin" generate "${model_flag[@]}" --prompts-file "$work/$kind.jsonl" --max-num-seqs "$c" \
        --trace "$work/trace.json" ${EXTRA:-} >/dev/null 2>"$work/$kind.err"
      python3 scripts/trace_summary.py "$work/trace.json" |
        awk -v k="$kind" '/ steps /{step = $(NF-3)} /^sample /{print k, step, $2}' >>"$work/c$c.txt"
    done
  done
  python3 - "$work/c$c.txt" "$c" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {k: [statistics.median(float(r[i]) for r in rows if r[0] == k) for i in (1, 2)]
       for k in ("plain", "constrained")}
(ps, pa), (cs, ca) = med["plain"], med["constrained"]
print(f"c = {sys.argv[2]}: step ms plain {ps:.3f}, constrained {cs:.3f} (ratio {cs / ps:.3f}); "
      f"sample op ms plain {pa:.4f}, constrained {ca:.4f} (+{(ca - pa) * 1000:.1f} us, "
      f"{(ca - pa) / ps * 100:.1f} % of the plain step); medians of {len(rows) // 2} runs each")
PY
done
