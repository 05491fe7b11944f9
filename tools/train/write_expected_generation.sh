#!/bin/bash
# Writes tests/data/default_model_generation.json: the shipped default model's greedy output for
# a fixed prompt, which tests/default_model_test.cc pins. Run after replacing models/default.
#
# The pinned output must not hang on a near tie: another machine's SIMD target (AVX2 instead of
# AVX-512, say) changes the logits by ~1e-6 relative, which flips an argmax whose top two
# logprobs are that close. So the output is cut before the first step whose top-1 / top-2 gap is
# under 1e-3 nats (~1000x the cross-target error).
#
#   write_expected_generation.sh MOESERVE_BINARY
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 MOESERVE_BINARY" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
prompt="And it came to pass"
generate() {  # generate MAX_TOKENS [FLAGS...]
  local n=$1; shift
  "$moeserve" generate --model "$root/models/default" --prompt "$prompt" --max-tokens "$n" \
    --temperature 0 --json "$@" 2>/dev/null
}
moeserve=$1
max_tokens=$(generate 48 --logprobs 2 | /usr/bin/python3 -c '
import json, sys
steps = json.load(sys.stdin)["requests"][0]["logprobs"]
keep = next((i for i, s in enumerate(steps)
             if len(s["top"]) > 1 and s["top"][0]["logprob"] - s["top"][1]["logprob"] < 1e-3),
            len(steps))
if keep < len(steps):
    print(f"near tie at output token {keep}: pinning {keep} tokens", file=sys.stderr)
print(keep)')
generate "$max_tokens" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["requests"][0]
out = {"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "token_ids": r["token_ids"],
       "text": r["text"]}
print(json.dumps(out, indent=2, ensure_ascii=False))' "$prompt" "$max_tokens" \
  >"$root/tests/data/default_model_generation.json"
echo "wrote $root/tests/data/default_model_generation.json ($max_tokens tokens)"
