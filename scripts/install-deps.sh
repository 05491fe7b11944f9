#!/usr/bin/env bash
# Installs what moeserve needs to build and test, from Debian's archive (Debian 12, as root).
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config        # toolchain
  clang-14 libclang-rt-14-dev             # libFuzzer targets (the fuzz preset)
  libhwy-dev                              # Highway: SIMD with dynamic dispatch
  nlohmann-json3-dev libfmt-dev           # JSON, formatting
  libgtest-dev libbenchmark-dev           # tests, benchmarks
  libpcre2-dev libutf8proc-dev            # tokenizer: regex with Unicode properties, NFC
  libcpp-httplib-dev                      # server
  libopenmpi-dev openmpi-bin              # ranks across processes and machines
  curl                                    # scripts/run.sh: the example request
  chromium                                # browser tests: the chat page, bench's report
  python3-torch python3-numpy             # tools/train (the default model), its smoke test
  python3-matplotlib libopenblas0-pthread #   loss plot; fast f32 BLAS for torch
  bible-kjv                               #   the training corpus (KJV; `bible` dumps it)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run reference implementations in a few tests (Hugging Face's tokenizers).
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
