#!/usr/bin/env bash
# What every browser test needs: Debian's Chromium at /usr/bin/chromium (scripts/install-deps.sh
# installs it), node, and the npm packages pinned in package.json installed into NODE_CACHE_DIR,
# with the test scripts copied beside them (Node resolves `import 'playwright-core'` from a
# script's own folder).
#
#   prepare.sh NODE_CACHE_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for tool in node npm /usr/bin/chromium; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed" >&2; exit 1; }
done
if ! "$here/../../scripts/npm-install-pinned.sh" "$here/package.json" "$1"; then
  echo "FAIL: could not install the pinned npm packages of $here/package.json into $1" >&2
  exit 1
fi
cp "$here"/*.mjs "$1/"
