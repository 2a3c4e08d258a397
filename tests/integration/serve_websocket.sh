#!/usr/bin/env bash
# The Responses WebSocket mode with the `ws` npm client: a 20-turn session on one socket (only
# the new input each turn, KV reused), cancelling mid-response with response.cancel, one response
# in flight per socket, and a client that drops its socket having its request cancelled.
# usage: tests/integration/serve_websocket.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_websocket.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"

start_server tiny --api-key sk-ws "${model_args[@]}"
start_server null --model null --null-step-us 2000
CEDAR_ROOT="$CEDAR_ROOT" URL_TINY="$url_tiny" URL_NULL="$url_null" node "$here/serve_websocket.mjs"
