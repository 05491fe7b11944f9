#!/usr/bin/env bash
# The main job: installs dependencies, builds moeserve (Release) and starts the OpenAI-compatible
# server on the default model, models/default (http://127.0.0.1:8000, or $PORT).
# Once the server is ready it sends the printed curl example once, to show it works. Ctrl-C stops
# the server.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"

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
echo "moeserve is serving $model as \"default\" on http://127.0.0.1:$port (Ctrl-C stops it). Try:"
echo
echo "$example"
echo
eval "${example/curl /curl -s }"
echo
echo
echo "Chat: the same with /v1/chat/completions and \"messages\"; any OpenAI client works with"
echo "base URL http://127.0.0.1:$port/v1. moeserve chat / generate / bench serve: see the README."
wait $server
