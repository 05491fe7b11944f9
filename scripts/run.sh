#!/usr/bin/env bash
# The main job: installs what building needs, builds the moeserve binary (Release; the tests are
# scripts/test.sh's) and starts the server on the default model, models/default: the chat page at
# http://127.0.0.1:8000/ (or $PORT) and the OpenAI-compatible API under /v1. Once the server is
# ready it prints the page's address and sends the printed curl example once, to show the API
# works. A second run finds everything built and starts in seconds. Ctrl-C stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
[[ -f build/release/build.ninja ]] || cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target moeserve

moeserve=build/release/cli/moeserve
model=models/default
port=${PORT:-8000}

"$moeserve" serve --model "$model" --served-model-name default --port "$port" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' INT TERM
for _ in $(seq 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  kill -0 $server 2>/dev/null || { wait $server; exit 1; }
  sleep 0.2
done

example="curl http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \\
  -d '{\"model\": \"default\", \"prompt\": \"And it came to pass\", \"max_tokens\": 32, \"temperature\": 0}'"
echo
echo "Chat with the model: open http://127.0.0.1:$port/ in a browser."
echo
echo "moeserve is serving $model as \"default\" (Ctrl-C stops it). The API, with curl:"
echo
echo "$example"
echo
eval "${example/curl /curl -s }"
echo
echo
echo "Chat: the page at http://127.0.0.1:$port/, or /v1/chat/completions with \"messages\"; any"
echo "OpenAI client works with base URL http://127.0.0.1:$port/v1. moeserve chat / generate /"
echo "bench serve: see the README."
wait $server
