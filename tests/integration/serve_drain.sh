#!/usr/bin/env bash
# While the model loads, the server already answers: /health 503 "loading", an API request a
# 503 error object, then 200 once it is up.
# SIGTERM drains: the server stops accepting at once, answers /health with 503 on connections
# already open, lets a running stream finish, and exits 0;
# with a short --drain-timeout-s a stream that would run on is cancelled (finish_reason
# "cancelled", then [DONE]) and the server still exits 0 within the timeout.
# usage: tests/integration/serve_drain.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_drain.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"
fail() { echo "FAIL: $*"; exit 1; }

# 0. A model that takes 3 s to load: the address answers from the start.
"$cedar" serve --host 127.0.0.1 --port 0 --model null --null-load-ms 3000 >"$tmp/load.log" 2>&1 &
pid_load=$!
server_pids+=("$pid_load")
url_load=""
for _ in $(seq 1 100); do
  url_load="$(grep -o 'bound to http://[0-9.:]*' "$tmp/load.log" | sed 's/bound to //')" || true
  [[ -n "$url_load" ]] && break
  sleep 0.05
done
[[ -n "$url_load" ]] || fail "no 'bound to' line: $(cat "$tmp/load.log")"
health="$(curl -s -m 2 -w ' %{http_code}' "$url_load/health")"
[[ "$health" == '{"status":"loading"} 503' ]] || fail "/health while loading: $health"
api="$(curl -s -m 2 -w ' %{http_code}' "$url_load/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}]}')"
[[ "$api" == *'"code":"not_ready"'*' 503' ]] || fail "a request while loading: $api"
grep -q 'listening on' "$tmp/load.log" && fail "the load took no time"
up=0
for _ in $(seq 1 100); do
  [[ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$url_load/health")" == 200 ]] && { up=1; break; }
  sleep 0.1
done
((up)) || fail "not serving 10 s after a 3 s load"
kill -TERM "$pid_load"; wait "$pid_load" || true
echo "  ok  while the model loads: /health 503 \"loading\", requests 503 not_ready; then 200"

# 1. A stream of 150 tokens at 5 ms each (~0.75 s) finishes although SIGTERM comes mid-way.
start_server a --model null --null-step-us 5000 --drain-timeout-s 20
curl -sN "$url_a/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":150,"stream":true}' >"$tmp/a.sse" &
client=$!
port="${url_a##*:}"
exec 3<>"/dev/tcp/127.0.0.1/$port"  # a keep-alive connection opened before the signal
sleep 0.3
kill -TERM "$pid_a"
sleep 0.1
if curl -s -m 2 -o /dev/null "$url_a/health"; then fail "still accepting connections after SIGTERM"; fi
printf 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' >&3
read -r -t 5 status_line <&3 || fail "no answer on the open connection"
[[ "$status_line" == "HTTP/1.1 503"* ]] || fail "/health while draining: $status_line"
exec 3<&-
wait "$client"
rc=0; wait "$pid_a" || rc=$?
[[ $rc == 0 ]] || fail "server exited $rc after draining"
grep -q '"finish_reason":"length"' "$tmp/a.sse" || fail "the running stream did not finish: $(tail -c 300 "$tmp/a.sse")"
[[ "$(grep -c '"content":" hi"\|"reasoning_content":" hi"' "$tmp/a.sse")" == 150 ]] || fail "tokens lost during the drain"
grep -q 'event=drain_start' "$tmp/a.log" && grep -q 'event=drain_done' "$tmp/a.log" || fail "no drain log lines"
echo "  ok  SIGTERM: stopped accepting, /health 503 on an open connection, finished the running stream (150 tokens), exit 0"

# 2. A stream that would take 100 s is cancelled at the 1 s drain timeout.
start_server b --model null --null-step-us 1000 --drain-timeout-s 1 --log-format json
curl -sN "$url_b/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":100000,"stream":true}' >"$tmp/b.sse" &
client=$!
sleep 0.3
start=$(date +%s%N)
kill -TERM "$pid_b"
rc=0; wait "$pid_b" || rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
wait "$client" || true
[[ $rc == 0 ]] || fail "server exited $rc"
((ms < 3000)) || fail "drain took $ms ms with --drain-timeout-s 1"
grep -q '"finish_reason":"cancelled"' "$tmp/b.sse" || fail "the cut stream was not told it was cancelled"
tail -c 20 "$tmp/b.sse" | grep -q 'data: \[DONE\]' || fail "the cut stream did not end with [DONE]"
echo "  ok  SIGTERM with --drain-timeout-s 1: the long stream was cancelled cleanly, exit 0 after $ms ms"
# --log-format json: every log line is one JSON object, with counts as numbers.
node -e '
  const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(l => l.startsWith("{"));
  const logs = lines.map(l => JSON.parse(l));
  const start = logs.find(l => l.event === "drain_start"), done = logs.find(l => l.event === "drain_done");
  const req = logs.find(l => l.path === "/v1/chat/completions");
  const ok = start && start.active === 1 && start.timeout_s === 1 && done && done.cancelled === 1 && req &&
    req.status === 200 && req.stream === true && typeof req.completion_tokens === "number" &&
    req.completion_tokens > 0 && typeof req.duration_ms === "number" && !("error" in req);
  if (!ok) { console.error(lines.join("\n")); process.exit(1); }' "$tmp/b.log" || fail "JSON log lines"
echo "  ok  --log-format json: drain and request lines are JSON with numbers as numbers"
