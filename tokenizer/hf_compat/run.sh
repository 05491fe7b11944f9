#!/usr/bin/env bash
# Differential check of moeserve's tokenizer against Hugging Face's tokenizers (the Rust library,
# through its official Node bindings, version pinned in package.json): compare.mjs encodes random
# texts with both, over the real Qwen3 tokenizer and variants of a small one that use the options
# Qwen3 does not (see compare.mjs).
#
#   run.sh NODE_CACHE_DIR DRIVER WORK_DIR TESTDATA_DIR
#
# NODE_CACHE_DIR  where the npm package is installed (kept between runs; installing needs the npm
#                 registry, later runs are offline)
# DRIVER          the tokenizer_hf_driver executable (hf_driver.cc)
# WORK_DIR        scratch folder, recreated on every run
# TESTDATA_DIR    testdata/ (qwen3-tokenizer, tiny-qwen3next)
#
# Exit status: 0 all agree, 1 a difference or failure, 77 node/npm are not installed (a skip).
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 NODE_CACHE_DIR DRIVER WORK_DIR TESTDATA_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
cache=$(cd "$1" && pwd)
driver=$2
rm -rf "$3"
mkdir -p "$3"
work=$(cd "$3" && pwd)
testdata=$4

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are needed for the Hugging Face tokenizers comparison" >&2
  exit 77
fi

"$here/../../scripts/npm-install-pinned.sh" "$here/package.json" "$cache"
# Node resolves `import 'tokenizers'` from the script's own folder, hence the copy.
cp "$here/compare.mjs" "$cache/compare.mjs"
node "$cache/compare.mjs" "$driver" "$work" "$testdata"
