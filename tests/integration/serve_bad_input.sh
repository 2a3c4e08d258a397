#!/usr/bin/env bash
# The bad-input table: each row sends one kind of bad input and expects its documented answer,
# while a healthy client streams from the same servers the whole time and must see no failure.
# Rows: malformed JSON, wrong field types, unknown fields (ignored), empty messages, invalid
# UTF-8, prompt token ids outside the vocabulary or naming the image token, a 100 MB body, oversized headers, unknown model / response id, a wrong key,
# refused /v1/ requests counted once in the total and once as failed, overload
# (429), 10,000 concurrent idle connections, a WebSocket frame announcing 1 GB, a client
# that never reads its stream, a request pipelined behind a running one (answered after it; a
# client that then leaves is cancelled), and an engine that fails mid-answer (--null-fail-after).
# usage: tests/integration/serve_bad_input.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_bad_input.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"

# 10,000 idle connections need 10,000 descriptors in the server and as many in the client.
want=12000
hard="$(ulimit -Hn)"
if [[ "$hard" != unlimited ]] && ((hard < want)); then want="$hard"; fi
ulimit -n "$want"
idle=10000
if (($(ulimit -n) < 10500)); then
  idle=$(( $(ulimit -n) - 500 ))
  echo "serve_bad_input: the descriptor limit is $(ulimit -n); testing $idle idle connections instead of 10,000"
fi

start_server main --model null --null-step-us 1000 --api-key sk-bad
start_server flood --model null --null-step-us 0 --write-timeout-s 2
start_server busy --model null --null-step-us 1000 --max-active 8
start_server failing --model null --null-step-us 200 --null-fail-after 3
CEDAR_ROOT="$CEDAR_ROOT" URL_MAIN="$url_main" URL_FLOOD="$url_flood" URL_BUSY="$url_busy" URL_FAILING="$url_failing" IDLE="$idle" \
  node "$here/serve_bad_input.mjs"
