#!/usr/bin/env bash
# Installs what moeserve needs from Debian's archive (Debian 12, as root):
#   install-deps.sh          to build and run it (scripts/run.sh)
#   install-deps.sh --test   also what the tests use (scripts/test.sh)
#   install-deps.sh --fuzz   also clang 14 for the libFuzzer build (scripts/fuzz_all.sh)
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config ccache # toolchain (ccache: rebuilds reuse unchanged objects)
  libhwy-dev                              # Highway: SIMD with dynamic dispatch
  nlohmann-json3-dev libfmt-dev           # JSON, formatting
  libgtest-dev libbenchmark-dev           # tests, benchmarks (the build configures them)
  libpcre2-dev libutf8proc-dev            # tokenizer: regex with Unicode properties, NFC
  zlib1g-dev                              # make-model: the embedded Qwen3 tokenizer, gzipped
  libboost-dev                            # server: Boost.Beast / Asio (HTTP front)
  libcpp-httplib-dev                      # HTTP clients: bench serve, tests
  libopenmpi-dev openmpi-bin              # ranks across processes and machines
  curl                                    # scripts/run.sh: the example request
)
test_packages=(
  chromium                                # browser tests: the chat page, bench's report
  python3-torch python3-numpy             # tools/train (the default model), its smoke test
  python3-matplotlib libopenblas0-pthread #   loss plot; fast f32 BLAS for torch
  bible-kjv                               #   the training corpus (KJV; `bible` dumps it)
  python3-jsonschema                      # structured/: outputs checked by an independent validator
  python3-jinja2                          # tool loops rendered as Hugging Face renders templates
)
fuzz_packages=(
  clang-14 libclang-rt-14-dev             # libFuzzer targets (the fuzz preset; not in CI)
)
case "${1:-}" in
  "") ;;
  --test) packages+=("${test_packages[@]}") ;;
  --fuzz) packages+=("${fuzz_packages[@]}") ;;
  *) echo "usage: $0 [--test | --fuzz]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run reference implementations and real clients in tests (Hugging Face's
# tokenizers, the openai package, playwright-core driving Chromium).
if [[ "${1:-}" == --test ]]; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
