#!/usr/bin/env bash
# Installs dependencies, builds moeserve (Release) and runs the main job on the default model:
# creates the `small` random model if it is absent, then inspects it.
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
