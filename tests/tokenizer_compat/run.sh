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

"$here/../../scripts/npm-install-pinned.sh" "$here/package.json" "$cache"
# Node resolves `import 'tokenizers'` from the script's own folder, hence the copy.
cp "$here/check_tokenizer.mjs" "$cache/check_tokenizer.mjs"

model="$work/tiny-qwen3"
rm -rf "$model"
"$moeserve" make-model --arch qwen3 --preset tiny --out "$model"
for file in tokenizer.json tokenizer_config.json; do
  [[ -f "$model/$file" ]] || { echo "FAIL: make-model wrote no $file" >&2; exit 1; }
done

node "$cache/check_tokenizer.mjs" "$model"
