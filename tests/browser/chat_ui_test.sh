#!/usr/bin/env bash
# The server's chat page in Debian's headless Chromium (chat_ui_test.mjs, driven by the npm
# package playwright-core, pinned in package.json), against a real `moeserve serve` of the default
# model with an API key: the page loads cleanly, a message streams the answer the API gives at
# temperature 0, Stop aborts the request on the server (/metrics counts it), a wrong key shows
# the server's error, the Server tab shows live numbers. Writes WORK_DIR/chat.png, the screenshot
# in docs/.
#
#   chat_ui_test.sh NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
#
# Exit status: 0 all checks passed, 1 a check failed (node, npm, chromium and the pinned package
# are required: this test never skips).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib/node_test_setup.sh"
[[ -x /usr/bin/chromium ]] || { echo "FAIL: /usr/bin/chromium is not installed" >&2; exit 1; }

api_key="chat-ui-test-key"
source "$here/../lib/serve.sh"
# The default model (the binary's own, MOESERVE_MODEL unset): Stop needs answers long enough to
# interrupt, which a random tiny model may end early.
start_server "$moeserve" "$work/serve.log" --api-key "$api_key" --served-model-name default \
  --max-model-len 2048 || exit 1

status=0
CHAT_UI_URL="$url" CHAT_UI_API_KEY="$api_key" CHAT_UI_MODEL=default \
  CHAT_UI_SCREENSHOT="$work/chat.png" \
  node --test-reporter=spec "$cache/chat_ui_test.mjs" || status=$?

finish "the chat page tests" $status
