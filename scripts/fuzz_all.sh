#!/usr/bin/env bash
# Runs every libFuzzer target in turn for SECONDS each (default 600) from its seed corpus and the
# corpus earlier runs kept, and prints one Markdown row per target for docs/fuzzing.md's runs of
# record: target, seconds, executions, corpus size, result. Builds the fuzz preset's targets it
# runs first (clang 14; CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs). Not part of
# scripts/test.sh, which replays each target's seed corpus under ASan instead (docs/fuzzing.md).
# Usage: scripts/fuzz_all.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=($(ls fuzz/corpus))
fi
scripts/install-deps.sh --fuzz
cmake --preset fuzz > /dev/null
cmake --build --preset fuzz --target "${targets[@]}"
logs=build/fuzz/fuzz/logs
mkdir -p "$logs"
echo "| target | seconds | executions | corpus | result |"
echo "|---|---|---|---|---|"
for t in "${targets[@]}"; do
  corpus=build/fuzz/fuzz/corpus/$t
  mkdir -p "$corpus"
  result=pass
  (cd "$logs" && ASAN_OPTIONS=detect_leaks=1 "../$t" -max_total_time="$seconds" -rss_limit_mb=4096 \
      -print_final_stats=1 "../corpus/$t" "../../../../fuzz/corpus/$t" > "$t.log" 2>&1) \
    || result="CRASH: see $logs/$t.log"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  files=$(ls "$corpus" | wc -l)
  echo "| \`$t\` | $seconds | $execs | $files | $result |"
done
