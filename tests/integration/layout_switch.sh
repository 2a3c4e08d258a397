#!/usr/bin/env bash
# Layout switches under load through the server: 32 WebSocket sessions (Responses WebSocket
# mode, the `ws` client) of 3 turns each stream while POST /admin/layout switches
# tp4 -> dep2 -> tp4 -> tp1; every turn must end normally with as many tokens as in an
# unswitched tp4 run, and (exact replay) with the same text. Then GET /admin/status, and a
# shard killed mid-stream (POST /admin/kill-shard, a test hook): every stream ends within 10 s,
# /health answers throughout, the rebuilt layout serves 32 new sessions, and the log records the
# loss and the rebuild.
# usage: tests/integration/layout_switch.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: layout_switch.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"
trap 'show_logs_on_failure; cleanup_servers' EXIT

# LAYOUT_START (default tp4), LAYOUT_PLAN (default dep2,tp4,tp1), LAYOUT_KILL (default 1; 0 skips
# the killed shard) and LAYOUT_PAGE_TOKENS (default 16) let the same run drive GPU layouts, e.g. on
# two GPUs: CEDAR_SERVE_MODEL_ARGS="--device cuda" LAYOUT_START=tp2 LAYOUT_PLAN=dep2,tp2,dep2
# LAYOUT_KILL=0 LAYOUT_PAGE_TOKENS=64
opts=(--model micro --layout "${LAYOUT_START:-tp4}" --page-tokens "${LAYOUT_PAGE_TOKENS:-16}" --swa-replay full
      --admin-key adm-layout "${model_args[@]}")
start_server ref "${opts[@]}"
start_server live "${opts[@]}"
CEDAR_ROOT="$CEDAR_ROOT" URL_REF="$url_ref" URL_LIVE="$url_live" node "$here/layout_switch.mjs"
# The operator's log tells of the killed shard and the rebuild that replaced it.
if [[ "${LAYOUT_KILL:-1}" != 0 ]]; then
  grep -q 'event=shard_lost rank=1 ' "$tmp/live.log" || { echo "no shard_lost event in the log"; exit 1; }
  grep -q 'event=layout_rebuilt cause=shard_failed ' "$tmp/live.log" || { echo "no layout_rebuilt event in the log"; exit 1; }
  grep -E 'event=(shard_lost|layout_rebuilt)' "$tmp/live.log" | sed 's/^/  log: /'
fi
