# Sourced by the test scripts that drive a real `moeserve serve` from outside (Node clients, a
# browser): starts it on a free loopback port and stops it.
#
#   start_server MOESERVE LOG [serve flags...]   sets server_pid and url (http://127.0.0.1:PORT),
#                                                or prints the log and returns 1
#   stop_server                                  SIGTERM, then the exit status of the server
#   finish WHAT CLIENT_STATUS                    stops the server and exits: 0 when the client's
#                                                checks passed (status 0) and the server exited 0
#                                                on SIGTERM, else 1 with the server's log
#   show_log                                     the server's log on stderr
#
# An EXIT trap kills a server still running when the script ends.

server_pid=""
server_log=""
url=""

show_log() {
  echo "---- moeserve serve log ($server_log) ----" >&2
  cat "$server_log" >&2 || true
  echo "---- end of server log ----" >&2
}

kill_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap kill_server EXIT

# A port nobody listens on now: the kernel's pick for a loopback listener, closed again. The
# server may still lose a race for it, so a bind failure retries with a new port.
free_port() {
  node -e '
    const s = require("net").createServer();
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => console.log(p)); });'
}

start_server() {
  local moeserve=$1
  server_log=$2
  shift 2
  local attempt port deadline code
  for attempt in 1 2 3; do
    port=$(free_port)
    url="http://127.0.0.1:$port"
    "$moeserve" serve --host 127.0.0.1 --port "$port" "$@" >"$server_log" 2>&1 &
    server_pid=$!
    # 503 while the weights load, refused before the bind; up to ~60 s.
    deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
      kill -0 "$server_pid" 2>/dev/null || break
      code=$(node -e '
        fetch(process.argv[1]).then(r => console.log(r.status), () => console.log(0));' \
        "$url/health" 2>/dev/null || echo 0)
      [[ "$code" == 200 ]] && return 0
      sleep 0.1
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "FAIL: the server on port $port did not answer GET /health with 200 within 60 s" >&2
      show_log
      return 1
    fi
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    echo "the server exited before it was healthy (attempt $attempt, port $port):" >&2
    show_log
    # Only a lost race for the port is worth another try.
    grep -q "cannot listen" "$server_log" || break
  done
  echo "FAIL: the server never became healthy" >&2
  return 1
}

stop_server() {
  local status=0
  kill -TERM "$server_pid"
  wait "$server_pid" || status=$?
  server_pid=""
  return $status
}

finish() {
  local what=$1 client_status=$2 server_status=0
  stop_server || server_status=$?
  if [[ $client_status -ne 0 ]]; then
    echo "FAIL: $what failed (exit status $client_status)" >&2
    show_log
    exit 1
  fi
  if [[ $server_status -ne 0 ]]; then
    echo "FAIL: moeserve serve exited with status $server_status on SIGTERM (want 0)" >&2
    show_log
    exit 1
  fi
  echo "PASS: $what passed and the server exited 0 on SIGTERM"
  exit 0
}
