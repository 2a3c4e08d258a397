# Shared by the serve_*.sh integration scripts (sourced, not run): start `cedar serve` on a free
# port, wait until it listens, and stop it on exit.
# usage: start_server NAME [serve options...]  -> sets url_NAME and pid_NAME; logs in $tmp/NAME.log

tmp="$(mktemp -d)"
server_pids=()
cleanup_servers() {
  for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${server_pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup_servers EXIT
export NODE_PATH="${NODE_PATH:-$CEDAR_ROOT/tools/node/node_modules}"
# CEDAR_SERVE_MODEL_ARGS: more `cedar serve` options for a script's model server (the one its
# clients call "tiny"), e.g. "--model micro --device cuda --served-model-name tiny" on a GPU machine
# (tools/gpu_integration.sh). Scripts pass "${model_args[@]}" to that server only.
read -ra model_args <<< "${CEDAR_SERVE_MODEL_ARGS:-}"

start_server() {
  local name="$1"; shift
  local log="$tmp/$name.log"
  "$cedar" serve --host 127.0.0.1 --port 0 "$@" >"$log" 2>&1 &
  local pid=$!
  server_pids+=("$pid")
  local url=""
  for _ in $(seq 1 600); do
    url="$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's/listening on //')" || true
    [[ -n "$url" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then echo "server $name did not start:"; cat "$log"; return 1; fi
    sleep 0.1
  done
  [[ -n "$url" ]] || { echo "server $name: no URL after 60 s"; cat "$log"; return 1; }
  printf -v "url_$name" '%s' "$url"
  printf -v "pid_$name" '%s' "$pid"
}

# Prints the server log when a script fails, to show why.
show_logs_on_failure() {
  local rc=$?
  if ((rc)); then for f in "$tmp"/*.log; do echo "--- $f (last 30 lines)"; tail -30 "$f"; done; fi
  cleanup_servers
  exit $rc
}
trap show_logs_on_failure EXIT
