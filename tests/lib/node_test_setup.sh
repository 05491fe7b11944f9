# Sourced by the Node-driven test scripts, after they set `here` to their own folder. Their
# arguments are all
#   NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
# (npm packages kept between runs; the moeserve executable; a scratch folder). Checks them and
# sets cache, moeserve and work to absolute paths (the folders created); exits 2 on a usage error.
# Then installs the npm packages pinned in $here/package.json into the cache (once: later runs
# are offline) and copies $here/*.mjs beside them, since Node resolves a script's imports from
# its own folder. Exits 1 when node, npm or the pinned packages are missing: these tests never
# skip.
if [[ $# -ne 3 ]]; then
  echo "usage: $0 NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR" >&2
  exit 2
fi
mkdir -p "$1" "$3"
cache=$(cd "$1" && pwd)
moeserve=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$(cd "$3" && pwd)
[[ -x "$moeserve" ]] || { echo "FAIL: $moeserve is not an executable" >&2; exit 1; }

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed" >&2; exit 1; }
done
if ! "$here/../../scripts/npm-install-pinned.sh" "$here/package.json" "$cache"; then
  echo "FAIL: could not install the pinned npm packages of $here/package.json into $cache" >&2
  exit 1
fi
cp "$here"/*.mjs "$cache/"
