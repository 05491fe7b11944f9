#!/usr/bin/env bash
# End-to-end tests of `moeserve serve` driven by the official OpenAI Node client (npm package
# `openai`, version pinned in package.json): a tiny random model is served on a free loopback
# port, openai_client_test.mjs runs its cases against it (comparing with `moeserve generate
# --json`), and the server must then exit 0 on SIGTERM.
#
#   run.sh NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
#
# NODE_CACHE_DIR  where the npm package is installed (kept between runs; installing needs the npm
#                 registry, later runs are offline)
# MOESERVE_BINARY the moeserve executable
# WORK_DIR        scratch folder; the model and the server log are recreated on every run
#
# Exit status: 0 all checks passed, 1 a check failed (node, npm and the pinned package are
# required: this test never skips).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib/node_test_setup.sh"

model="$work/model"
rm -rf "$model"
"$moeserve" make-model --arch qwen3_next --preset tiny --seed 3 --out "$model" >/dev/null

api_key="openai-client-test-key"
source "$here/../lib/serve.sh"
start_server "$moeserve" "$work/serve.log" --model "$model" --api-key "$api_key" \
  --served-model-name tiny --max-model-len 256 || exit 1

status=0
OPENAI_TEST_URL="$url" OPENAI_TEST_API_KEY="$api_key" OPENAI_TEST_MOESERVE="$moeserve" \
  OPENAI_TEST_MODEL="$model" OPENAI_TEST_MAX_MODEL_LEN=256 \
  node --test-reporter=spec "$cache/openai_client_test.mjs" || status=$?
if [[ $status -ne 0 ]]; then finish "the OpenAI client tests" $status; fi
if ! stop_server; then
  echo "FAIL: moeserve serve exited non-zero on SIGTERM" >&2
  show_log
  exit 1
fi

# An agent's loop: the default model with Qwen3.5's template (tool calls and reasoning by auto).
start_server "$moeserve" "$work/serve_agent.log" --api-key "$api_key" --served-model-name agent \
  --chat-template "$here/../../testdata/chat-templates/qwen3.5.jinja" --max-model-len 2048 || exit 1
OPENAI_TEST_URL="$url" OPENAI_TEST_API_KEY="$api_key" OPENAI_TEST_MODEL=agent \
  node --test-reporter=spec "$cache/openai_agent_test.mjs" || status=$?

finish "the OpenAI client tests" $status
