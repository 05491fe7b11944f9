#!/usr/bin/env bash
# Installs dependencies, builds moeserve and runs the whole test suite under ctest: first the
# Release build, then the same suite under AddressSanitizer + UndefinedBehaviorSanitizer (skip
# that second pass with MOESERVE_SKIP_ASAN=1).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc)
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if [ "${MOESERVE_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
