#!/usr/bin/env bash
# The soak test by hand: 64 clients (MOESERVE_SOAK_CLIENTS) for 10 minutes (MOESERVE_SOAK_SECONDS)
# against `moeserve serve` on the default model; the suite runs the same test for 60 s.
#   tests/soak/run.sh [SECONDS] [CLIENTS]
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target moeserve soak_test
MOESERVE_SOAK_SECONDS=${1:-600} MOESERVE_SOAK_CLIENTS=${2:-64} build/release/tests/soak_test
