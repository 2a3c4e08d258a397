#!/usr/bin/env bash
# SSE framing as curl sees it: chunked text/event-stream, every event a "data: {json}" block
# ended by a blank line, [DONE] last for chat and completions; Responses events carry an
# "event:" line matching their type and increasing sequence numbers; errors are OpenAI error
# objects with their status; /health, /metrics and HEAD work; idle connections close after
# --idle-timeout-s; /admin/* needs --admin-key; --max-connections refuses the excess.
# usage: tests/integration/serve_sse_curl.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: serve_sse_curl.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"
start_server tiny
start_server idle --model null --idle-timeout-s 1 --admin-key adm
start_server full --model null --idle-timeout-s 60 --max-connections 4

fail() { echo "FAIL: $*"; exit 1; }

curl -sS -D "$tmp/h1" -N "$url_tiny/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"thinking":false}}' \
  >"$tmp/chat.sse"
grep -qi '^content-type: text/event-stream' "$tmp/h1" || fail "chat stream content type"
grep -qi '^transfer-encoding: chunked' "$tmp/h1" || fail "chat stream not chunked"
python3 - "$tmp/chat.sse" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
assert raw.endswith("data: [DONE]\n\n"), repr(raw[-40:])
blocks = raw.split("\n\n")[:-1]
assert all(b.startswith("data: ") and "\n" not in b for b in blocks), "an event is not one data line"
events = [json.loads(b[6:]) for b in blocks[:-1]]
assert events[0]["choices"][0]["delta"]["role"] == "assistant"
assert len({e["id"] for e in events}) == 1, "chunks disagree on the id"
assert all(e["object"] == "chat.completion.chunk" for e in events)
finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
assert len(finish) == 1, "one finish chunk"
usage = events[-1]
assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5, usage
text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
assert text, "no text"
print("  ok  chat SSE: %d events, text %r" % (len(events), text[:40]))
PY

curl -sS -N "$url_tiny/v1/responses" -d '{"input":"Hello","max_output_tokens":4,"stream":true,"reasoning":{"effort":"none"}}' >"$tmp/resp.sse"
python3 - "$tmp/resp.sse" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
blocks = [b for b in raw.split("\n\n") if b]
seq = -1
types = []
for b in blocks:
    lines = b.split("\n")
    assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), b
    e = json.loads(lines[1][6:])
    assert e["type"] == lines[0][7:], (e["type"], lines[0])
    assert e["sequence_number"] == seq + 1
    seq = e["sequence_number"]
    types.append(e["type"])
assert types[:2] == ["response.created", "response.in_progress"], types[:3]
assert types[-1] in ("response.completed", "response.incomplete"), types[-1]
assert types.count("response.output_text.delta") >= 1
print("  ok  responses SSE: %d events, sequence numbers 0..%d" % (len(types), seq))
PY

curl -sS -N "$url_tiny/v1/completions" -d '{"prompt":"abc","max_tokens":3,"stream":true}' >"$tmp/cmpl.sse"
tail -c 14 "$tmp/cmpl.sse" | grep -q 'data: \[DONE\]' || fail "completions stream does not end with [DONE]"
echo "  ok  completions SSE ends with [DONE]"

code="$(curl -s -o "$tmp/err.json" -w '%{http_code}' "$url_tiny/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"model":"gpt-9"}')"
[[ "$code" == 404 ]] || fail "unknown model gave $code"
python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["code"]=="model_not_found" and e["param"]=="model", e' "$tmp/err.json"
echo "  ok  unknown model: 404 model_not_found"

[[ "$(curl -s -o /dev/null -w '%{http_code}' "$url_tiny/health")" == 200 ]] || fail "/health"
curl -s "$url_tiny/metrics" >"$tmp/metrics.txt"
for m in cedar_requests_running cedar_requests_waiting cedar_kv_pages_used cedar_kv_pages_free \
         cedar_prefix_cache_hit_rate cedar_prompt_tokens_total cedar_generation_tokens_total \
         cedar_time_to_first_token_seconds_bucket cedar_inter_token_latency_seconds_bucket cedar_topology_info; do
  grep -q "^$m" "$tmp/metrics.txt" || fail "metric $m missing"
done
awk '/^cedar_generation_tokens_total /{ if ($2 < 12) exit 1 }' "$tmp/metrics.txt" || fail "tokens out not counted"
echo "  ok  /health 200 and /metrics has every cedar_* family"
[[ "$(curl -s -o /dev/null -w '%{http_code}' -I "$url_tiny/v1/models")" == 200 ]] || fail "HEAD"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$url_tiny/admin/state")" == 404 ]] || fail "admin without --admin-key"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$url_tiny/nope")" == 404 ]] || fail "unknown path"
echo "  ok  HEAD, /admin off by default, unknown path 404"

# An idle connection is closed after --idle-timeout-s (1 s here).
port="${url_idle##*:}"
start=$(date +%s%N)
exec 3<>"/dev/tcp/127.0.0.1/$port"
timeout 10 cat <&3 >/dev/null || fail "idle connection still open after 10 s"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
exec 3<&-
((ms >= 950 && ms < 3000)) || fail "idle connection closed after $ms ms, expected about 1000"
echo "  ok  an idle connection is closed after the idle timeout ($ms ms)"

# /admin/* with --admin-key: the key opens it, anything else is 401.
[[ "$(curl -s -o "$tmp/admin.json" -w '%{http_code}' -H 'Authorization: Bearer adm' "$url_idle/admin/state")" == 200 ]] || fail "admin with its key"
grep -q '"model":"null"' "$tmp/admin.json" || fail "admin state body: $(cat "$tmp/admin.json")"
[[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' "$url_idle/admin/state")" == 401 ]] || fail "admin with a wrong key"
echo "  ok  /admin/state answers with --admin-key and refuses other keys"
# a layout switch on an engine without layouts: 404 no_layouts, as GET /admin/status says
sw="$(curl -s -w ' %{http_code}' -H 'Authorization: Bearer adm' -d '{"layout":"tp2"}' "$url_idle/admin/layout")"
[[ "$sw" == *'"code":"no_layouts"'*' 404' ]] || fail "POST /admin/layout on the null engine: $sw"
echo "  ok  POST /admin/layout without layouts: 404 no_layouts"

# --max-connections 4 (a server whose idle connections stay open for a minute): with 4 idle
# connections open, a fifth is refused; once they close it works. The server accepts
# asynchronously, so a busy machine may serve a probe before it has taken all four: the
# refusal must come within 5 s, and so must the recovery.
port_full="${url_full##*:}"
for fd in 4 5 6 7; do eval "exec $fd<>/dev/tcp/127.0.0.1/$port_full"; done
refused=0
for _ in $(seq 50); do
  if ! curl -s -m 2 -o /dev/null "$url_full/health"; then refused=1; break; fi
  sleep 0.1
done
((refused)) || fail "a fifth connection was served for 5 s with four open"
for fd in 4 5 6 7; do eval "exec $fd<&-"; done
served=0
for _ in $(seq 50); do
  [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url_full/health")" == 200 ]] && { served=1; break; }
  sleep 0.1
done
((served)) || fail "not serving 5 s after the idle connections closed"
refused_total="$(curl -s "$url_full/metrics" | awk '/^cedar_connections_refused_total /{print $2}')"
((refused_total >= 1)) || fail "refused connections not counted: '$refused_total'"
echo "  ok  --max-connections refuses connections beyond the limit (counted: $refused_total) and recovers"
