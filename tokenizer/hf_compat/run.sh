#!/usr/bin/env bash
# Differential check of moeserve's tokenizer against Hugging Face's tokenizers (the Rust library,
# through its official Node bindings, version pinned in package.json): compare.mjs encodes random
# texts with both, over the real Qwen3 tokenizer and variants of a small one that use the options
# Qwen3 does not (see compare.mjs).
#
#   run.sh NODE_CACHE_DIR DRIVER WORK_DIR SHARED_DIR
#
# NODE_CACHE_DIR  where the npm package is installed (kept between runs; installing needs the npm
#                 registry, later runs are offline)
# DRIVER          the tokenizer_hf_driver executable (hf_driver.cc)
# WORK_DIR        scratch folder, recreated on every run
# SHARED_DIR      ../shared (testdata/qwen3-tokenizer, testdata/tiny-qwen3next)
#
# Exit status: 0 all agree, 1 a difference or failure, 77 node/npm are not installed (a skip).
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 NODE_CACHE_DIR DRIVER WORK_DIR SHARED_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
cache=$(cd "$1" && pwd)
driver=$2
rm -rf "$3"
mkdir -p "$3"
work=$(cd "$3" && pwd)
shared=$4

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are needed for the Hugging Face tokenizers comparison" >&2
  exit 77
fi

# Install only when the pinned version is not already there, so reruns need no network.
installed() {
  node -e '
    const fs = require("fs");
    const want = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).dependencies;
    for (const [name, version] of Object.entries(want)) {
      const file = `${process.argv[2]}/node_modules/${name}/package.json`;
      if (!fs.existsSync(file) || JSON.parse(fs.readFileSync(file, "utf8")).version !== version) {
        process.exit(1);
      }
    }' "$here/package.json" "$cache"
}
if ! installed; then
  cp "$here/package.json" "$cache/package.json"
  (cd "$cache" && npm install --no-audit --no-fund --no-package-lock --loglevel=error)
  installed || { echo "FAIL: npm install did not provide the pinned packages" >&2; exit 1; }
fi
# Node resolves `import 'tokenizers'` from the script's own folder, hence the copy.
cp "$here/compare.mjs" "$cache/compare.mjs"
node "$cache/compare.mjs" "$driver" "$work" "$shared"
