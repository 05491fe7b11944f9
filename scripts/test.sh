#!/usr/bin/env bash
# Installs dependencies, builds moeserve (Release) and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc)
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"
