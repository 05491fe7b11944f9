#!/usr/bin/env bash
# Installs dependencies, builds moeserve and runs the whole test suite under ctest: the Release
# build; the same suite under AddressSanitizer + UndefinedBehaviorSanitizer; and every libFuzzer
# target for a short fixed budget (docs/fuzzing.md). MOESERVE_SKIP_ASAN=1 / MOESERVE_SKIP_FUZZ=1
# skip the second / third pass.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
jobs=$(nproc)
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if [ "${MOESERVE_SKIP_FUZZ:-0}" != 1 ]; then
  cmake --preset fuzz
  cmake --build --preset fuzz -j "$jobs"
  ctest --preset fuzz -j "$jobs"
fi

if [ "${MOESERVE_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
