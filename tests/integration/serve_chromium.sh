#!/usr/bin/env bash
# The chat page at / in headless Chromium (playwright-core): it connects over the Responses
# WebSocket mode, streams the answer as it comes, shows reasoning and the tool call apart from
# the text, and fills in live metrics. The null model is scripted so the answer is known.
# usage: tests/integration/serve_chromium.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_chromium.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"
[[ -x /usr/bin/chromium ]] || { echo "serve_chromium: /usr/bin/chromium is missing (tools/setup.sh installs it)"; exit 1; }

script=$'Let me check the weather.</think>Here is what I found for Paris today, one word at a time.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n<｜DSML｜ parameter name="location" string="true">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>'
start_server page --model null --null-step-us 40000 --null-output "$script"
CEDAR_ROOT="$CEDAR_ROOT" URL="$url_page" PROFILE="$tmp/profile" node "$here/serve_chromium.mjs"
