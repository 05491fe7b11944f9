#!/usr/bin/env bash
# `bench latency --report` rendered in Debian's headless Chromium (report_test.mjs, driven by the
# npm package playwright-core, pinned in package.json): a run on a tiny random model with several
# batch sizes and the ablation writes the page and its JSON; the test checks every chart against
# the JSON from the rendered DOM and writes a screenshot, WORK_DIR/report.png.
#
#   report_test.sh NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
#
# Exit status: 0 all checks passed, 1 a check failed (node, npm, chromium and the pinned package
# are required: this test never skips).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib/node_test_setup.sh"
[[ -x /usr/bin/chromium ]] || { echo "FAIL: /usr/bin/chromium is not installed" >&2; exit 1; }

rm -rf "$work/model" "$work/report.html" "$work/report.json"
"$moeserve" make-model --arch qwen3_next --preset tiny --seed 3 --out "$work/model" >/dev/null
if ! "$moeserve" bench latency --model "$work/model" --batch-size 1,2,4 --input-len 16 \
    --output-len 8 --spec mtp:1 --ablation --ablation-rounds 1 \
    --report "$work/report.html" --json "$work/report.json" >"$work/bench.log" 2>&1; then
  cat "$work/bench.log" >&2
  echo "FAIL: bench latency --report failed" >&2
  exit 1
fi
REPORT_HTML="$work/report.html" REPORT_JSON="$work/report.json" \
  REPORT_SCREENSHOT="$work/report.png" \
  node --test-reporter=spec "$cache/report_test.mjs"
