#!/usr/bin/env bash
# `cedar serve` driven by the official openai npm SDK: chat (plain and streaming, usage and
# cached tokens), a tool-call round trip, forced tool calls, parallel_tool_calls, completions, the Responses API with
# previous_response_id, and the context window's limits (a tiny server with a small KV budget).
# The tiny model answers real requests; the null model, scripted with --null-output, emits
# reasoning, a line of text and a DSML tool call so the output parser path is end to end.
# usage: tests/integration/serve_openai.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_openai.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"

dsml=$'I should call\n\nthe weather tool.</think>Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n<｜DSML｜ parameter name="location" string="true">Paris</｜DSML｜ parameter>\n<｜DSML｜ parameter name="days" string="false">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>'
start_server tiny --api-key sk-test --swa-replay full --admin-key adm "${model_args[@]}"
start_server null --model null --null-output "$dsml" --null-step-us 200
# two calls in one block, for parallel_tool_calls
call() { printf '<｜DSML｜ invoke name="get_weather">\n<｜DSML｜ parameter name="location" string="true">%s</｜DSML｜ parameter>\n</｜DSML｜ invoke>' "$1"; }
two_calls=$'\n\n<｜DSML｜ calls>\n'"$(call Paris)"$'\n'"$(call London)"$'\n</｜DSML｜ calls>'
start_server twocalls --model null --null-output "$two_calls" --null-step-us 200
# a KV budget of 700 kB: a context window of a few hundred tokens at most
start_server window --model tiny --kv-budget-bytes 700000
CEDAR_ROOT="$CEDAR_ROOT" URL_TINY="$url_tiny" URL_NULL="$url_null" URL_WINDOW="$url_window" URL_TWOCALLS="$url_twocalls" NULL_SCRIPT="$dsml" \
  node "$here/serve_openai.mjs"
