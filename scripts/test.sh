#!/usr/bin/env bash
# Installs dependencies, builds moeserve and runs the whole test suite under ctest: the Release
# build; the threaded tests under ThreadSanitizer; the whole suite under AddressSanitizer +
# UndefinedBehaviorSanitizer, which includes every fuzz target replaying its seed corpus
# (NAME_replay: the target built with gcc and fuzz/replay_main.cc, each seed once).
# MOESERVE_SKIP_TSAN=1 / MOESERVE_SKIP_ASAN=1 skip a pass (the latter the fuzz replays too).
# Real fuzzing (libFuzzer, the clang-14 `fuzz` preset: a second sanitized build of every layer,
# ~11 minutes on 2 cores) is by hand, not here: scripts/fuzz_all.sh [SECONDS] [TARGET...]
# (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --test
jobs=$(nproc)
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

# ThreadSanitizer over the tests of code that runs on several threads: the thread pool, the
# communicators and rank groups, the engine loop, the HTTP server and front with clients on
# threads, and a structured-output grammar shared by matchers on threads.
# Only those targets are built.
if [ "${MOESERVE_SKIP_TSAN:-0}" != 1 ]; then
  cmake --preset tsan
  cmake --build --preset tsan -j "$jobs" --target core_test parallel_test model_group_test server_unit_test structured_test
  ctest --preset tsan -j "$jobs" -R '(ThreadPool|LocalCommunicator|SingleRankCommunicator|LinkModel|ModelGroup|EngineLoop|HttpServerThreads|HttpFront|Matcher)Test'
fi

# Everything but a few tests whose work is mostly not ours to sanitize: the training smoke test
# (PyTorch), the differential tokenizer test (Hugging Face's tokenizers in Node; our tokenizer's
# unit tests and fuzz targets' replays run here), the official `openai` client and the chat page
# in Chromium against the server (the server's paths run under ASan in server_test, tool_calls_test,
# the soak and the request and HTTP fuzz targets' replays), and structured output's validation
# runs through `generate` (Python's validators over many outputs; the grammar and sampler run
# under ASan in structured_test, engine_sampler_test and server_test), and the longest tool-call
# case (32 requests through two servers; the other ToolCallsTest cases run the same paths here).
# All of them run in the Release pass.
if [ "${MOESERVE_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs" \
    -E '^(train_smoke|tokenizer_hf_differential|openai_client|browser_chat_ui|StructuredOutputTest\..*|ToolCallsTest\.RequiredAndNamedCallsValidateStreamedOrNot)$'
fi
