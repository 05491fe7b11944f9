# Sourced by the Node-driven test scripts, whose arguments are all
#   NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR
# (npm packages kept between runs; the moeserve executable; a scratch folder). Checks them and
# sets cache, moeserve and work to absolute paths (the folders created); exits 2 on a usage error.
if [[ $# -ne 3 ]]; then
  echo "usage: $0 NODE_CACHE_DIR MOESERVE_BINARY WORK_DIR" >&2
  exit 2
fi
mkdir -p "$1" "$3"
cache=$(cd "$1" && pwd)
moeserve=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$(cd "$3" && pwd)
[[ -x "$moeserve" ]] || { echo "FAIL: $moeserve is not an executable" >&2; exit 1; }
