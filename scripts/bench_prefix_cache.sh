#!/usr/bin/env bash
# The prefix-caching benchmarks of docs/performance.md, by hand (minutes on 2 cores):
#   scripts/bench_prefix_cache.sh [MODEL_DIR] [OUT_DIR]
# MODEL_DIR defaults to a bench preset made by make-model in /tmp/moeserve-bench. SKIP_TURNS=1
# skips part 1; PROMPTS (8) sets the requests of each bench serve run.
#  1. an 8-turn conversation (each turn +250 tokens in, 64 out): TTFT per turn with and without
#     prefix caching (`bench latency --turns`);
#  2. `bench serve` against `serve` with and without caching: a shared random prefix of
#     PREFIX tokens (512, then 100) before 64 random ones, at concurrency 1 and 4; hit rate from
#     /metrics (vllm:prefix_cache_hits_total / _queries_total) and TTFT.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/release/cli/moeserve
MODEL=${1:-/tmp/moeserve-bench}
OUT=${2:-/tmp/moeserve-bench-prefix}
PORT=${PORT:-8391}
PROMPTS=${PROMPTS:-8}
mkdir -p "$OUT"
[[ -f "$MODEL/config.json" ]] || "$BIN" make-model --preset bench --out "$MODEL"

if [[ "${SKIP_TURNS:-0}" != 1 ]]; then
  echo "== 8-turn conversation" >&2
  "$BIN" bench latency --model "$MODEL" --turns 8 --input-len 250 --output-len 64 \
    --json "$OUT/turns.json" 2>/dev/null | tail -n +4
fi

metric() {  # name
  curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" 'index($0, n "{") == 1 {print $2}'
}

echo
printf '%-8s %6s %4s %10s %14s %14s\n' caching prefix c "hit rate" "mean TTFT ms" "p99 TTFT ms"
for caching in on off; do
  flag=""; [[ $caching == off ]] && flag="--no-enable-prefix-caching"
  "$BIN" serve --model "$MODEL" --port "$PORT" --max-num-seqs 4 $flag 2> "$OUT/serve-$caching.log" &
  server=$!
  until curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" | grep -q 200; do
    sleep 0.5
  done
  for prefix in 512 100; do
    for c in 1 4; do
      q0=$(metric vllm:prefix_cache_queries_total); h0=$(metric vllm:prefix_cache_hits_total)
      json="$OUT/serve-$caching-p$prefix-c$c.json"
      "$BIN" bench serve --port "$PORT" --tokenizer "$MODEL" --num-prompts "$PROMPTS" \
        --max-concurrency "$c" --random-prefix-len "$prefix" --random-input-len 64 \
        --random-output-len 16 --ignore-eos --seed "$c$prefix" --result-json "$json" \
        > "$OUT/serve-$caching-p$prefix-c$c.txt" 2>&1
      q1=$(metric vllm:prefix_cache_queries_total); h1=$(metric vllm:prefix_cache_hits_total)
      python3 - "$json" "$caching" "$prefix" "$c" "$q0" "$q1" "$h0" "$h1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
caching, prefix, c = sys.argv[2:5]
q0, q1, h0, h1 = (float(x) for x in sys.argv[5:9])
rate = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
print(f"{caching:<8} {prefix:>6} {c:>4} {rate:>9.1%} {r['mean_ttft_ms']:>14.1f} {r['p99_ttft_ms']:>14.1f}")
PY
    done
  done
  kill "$server"; wait "$server" || true
done
