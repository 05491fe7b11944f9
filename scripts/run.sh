#!/usr/bin/env bash
# Installs dependencies, builds moeserve (Release) and runs the main job on the default model:
# creates the `small` random model if it is absent, inspects it, and generates a few tokens
# greedily (token ids: the random model has no meaningful text yet).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"

model=models/small-random
if [ ! -f "$model/config.json" ]; then
  build/release/cli/moeserve make-model --arch qwen3_next --preset small --seed 0 --out "$model"
fi
build/release/cli/moeserve inspect --model "$model"
echo
echo "greedy generation from token ids 1,2,3:"
build/release/cli/moeserve generate --model "$model" --token-ids 1,2,3 --max-tokens 32 --ignore-eos
