#!/usr/bin/env bash
# Checks that the tokenizer files `moeserve make-model` writes load and round-trip in Hugging
# Face's tokenizers (the Rust library, through its official Node bindings, version pinned in
# package.json).
#
#   run.sh NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
#
# NODE_CACHE_DIR  where the npm package is installed (kept between runs; installing needs the npm
#                 registry, later runs are offline)
# MOESERVE_BINARY the moeserve executable
# WORK_DIR        scratch folder; WORK_DIR/tiny-qwen3 is recreated on every run
#
# Exit status: 0 all checks passed, 1 a check failed, 77 node/npm are not installed (a skip).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1" "$3"
cache=$(cd "$1" && pwd)
moeserve=$2
work=$(cd "$3" && pwd)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are needed for the Hugging Face tokenizers check" >&2
  exit 77
fi

# Install only when the pinned versions are not already there, so reruns need no network.
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
cp "$here/check_tokenizer.mjs" "$cache/check_tokenizer.mjs"

model="$work/tiny-qwen3"
rm -rf "$model"
"$moeserve" make-model --arch qwen3 --preset tiny --out "$model"
for file in tokenizer.json tokenizer_config.json; do
  [[ -f "$model/$file" ]] || { echo "FAIL: make-model wrote no $file" >&2; exit 1; }
done

node "$cache/check_tokenizer.mjs" "$model"
