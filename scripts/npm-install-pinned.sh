#!/usr/bin/env bash
# Installs the npm packages pinned in a package.json into a cache folder, only when the pinned
# versions are not there already (so test reruns need no network). Used by the tests that drive
# real JavaScript clients and reference libraries (Hugging Face tokenizers, ...).
#
#   npm-install-pinned.sh PACKAGE_JSON NODE_CACHE_DIR
#
# Exit status: 0 installed (or already there), 1 npm did not provide the pinned versions.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PACKAGE_JSON NODE_CACHE_DIR" >&2
  exit 2
fi
package_json=$1
mkdir -p "$2"
cache=$(cd "$2" && pwd)

installed() {
  node -e '
    const fs = require("fs");
    const want = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).dependencies;
    for (const [name, version] of Object.entries(want)) {
      const file = `${process.argv[2]}/node_modules/${name}/package.json`;
      if (!fs.existsSync(file) || JSON.parse(fs.readFileSync(file, "utf8")).version !== version) {
        process.exit(1);
      }
    }' "$package_json" "$cache"
}
if ! installed; then
  cp "$package_json" "$cache/package.json"
  (cd "$cache" && npm install --no-audit --no-fund --no-package-lock --loglevel=error)
  installed || { echo "FAIL: npm install did not provide the pinned packages" >&2; exit 1; }
fi
