#!/usr/bin/env bash
# `cedar bench` against a stand-in OpenAI-compatible server (standin_server.mjs, no cedar inside):
# a sweep over concurrency 1,2,4 on Chat Completions SSE, Responses SSE and Responses WebSocket;
# a server that omits usage and stops short of max_tokens; a real trace with subagents; and an A/B
# compare. Checks the JSON for sane values and zero errors.
# usage: bench_standin.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: bench_standin.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
traces="${CEDAR_TRACES:-/work/shared/data/agent-traces}"
work="$(mktemp -d)"
server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# Starts the stand-in with the given options; sets $port.
start_server() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  node "$here/standin_server.mjs" --port 0 "$@" >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do
    port="$(sed -n 's/^listening //p' "$work/server.log")"
    [[ -n "$port" ]] && return 0
    sleep 0.1
  done
  echo "stand-in server did not start"; cat "$work/server.log"; return 1
}

# Runs a node check script over a results.json: $1 file, $2 script body using `r` and `fail()`.
check() {
  node -e '
    const fs = require("fs");
    const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    let bad = 0;
    const fail = (what) => { console.error("bench_standin: " + what); bad++; };
    '"$2"'
    process.exit(bad ? 1 : 0);
  ' "$1"
}

quick=(--scale 0.01 --think-scale 0.01 --max-think 0.05 --warmup 1 --duration 3 --sessions 32)

echo "== sweep over three APIs"
start_server --tps 300
"$cedar" bench --url "http://127.0.0.1:$port" "${quick[@]}" --concurrency 1,2,4 \
  --api chat,responses,ws --label standin --out "$work/sweep" >/dev/null 2>"$work/sweep.err" \
  || { cat "$work/sweep.err"; exit 1; }
grep -q 'measure' "$work/sweep.err" || { echo "no progress lines"; exit 1; }
check "$work/sweep/results.json" '
  if (r.configs.length !== 3) fail("expected 3 configs");
  if (r.meta.model !== "standin-1") fail(`model not discovered: ${r.meta.model}`);
  for (const c of r.configs) {
    if (c.runs.map((p) => p.concurrency).join() !== "1,2,4") fail(`${c.label}: concurrency`);
    for (const p of c.runs) {
      const at = `${c.label} c=${p.concurrency}`;
      if (p.errors.total !== 0) fail(`${at}: errors ${JSON.stringify(p.errors)}`);
      if (!(p.requests > 0)) fail(`${at}: no requests`);
      if (!(p.ttft_ms.p50 > 0 && p.ttft_ms.p50 <= p.ttft_ms.p90 && p.ttft_ms.p90 <= p.ttft_ms.p99)) fail(`${at}: ttft ${JSON.stringify(p.ttft_ms)}`);
      if (!(p.e2e_ms.p50 >= p.ttft_ms.p50)) fail(`${at}: e2e below ttft`);
      // 300 tok/s per request: inter-token latency near 3.3 ms (timers only run late).
      if (!(p.itl_ms.p50 > 2.5 && p.itl_ms.p50 < 100)) fail(`${at}: itl p50 ${p.itl_ms.p50}`);
      if (!(p.interactivity_tok_s_user > 0 && p.interactivity_tok_s_user <= 1000 / p.itl_ms.p50 + 1e-9)) fail(`${at}: interactivity`);
      if (!(p.output_tokens_per_s > 0 && p.total_tokens_per_s > p.output_tokens_per_s)) fail(`${at}: throughput`);
      if (!(p.prefix_cache_hit_rate > 0.5 && p.prefix_cache_hit_rate <= 1)) fail(`${at}: prefix hit ${p.prefix_cache_hit_rate}`);
      if (!(p.usage_cached_fraction > 0.5)) fail(`${at}: usage cached ${p.usage_cached_fraction}`);
    }
    if (!(c.runs[2].output_tokens_per_s > c.runs[0].output_tokens_per_s)) fail(`${c.label}: no scaling 1 -> 4`);
  }'
grep -q '| standin/ws | 4 |' "$work/sweep/results.md" || { echo "results.md lacks rows"; exit 1; }
[[ "$(grep -c '<polyline' "$work/sweep/curve.svg")" == 3 ]] || { echo "curve.svg: expected 3 curves"; exit 1; }

echo "== a server without usage that stops early"
start_server --tps 300 --no-usage --short-prob 0.7
"$cedar" bench --url "http://127.0.0.1:$port" "${quick[@]}" --concurrency 2 --api chat,ws \
  --out "$work/short" >/dev/null 2>"$work/short.err" || { cat "$work/short.err"; exit 1; }
check "$work/short/results.json" '
  for (const c of r.configs) for (const p of c.runs) {
    const at = `${c.label}`;
    if (p.errors.total !== 0) fail(`${at}: errors ${JSON.stringify(p.errors)}`);
    if (!(p.requests > 0 && p.short_outputs > 0)) fail(`${at}: short outputs ${p.short_outputs}/${p.requests}`);
    if (p.usage_cached_fraction !== null) fail(`${at}: usage fraction without usage`);
    if (!(p.output_tokens > 0 && p.itl_ms.p50 > 0)) fail(`${at}: tokens not counted without usage`);
  }'

echo "== a server that answers without streaming: errors, counted by kind; exit 1, the report written"
start_server --no-stream
rc=0
"$cedar" bench --url "http://127.0.0.1:$port" "${quick[@]}" --concurrency 1 --duration 1 --api chat \
  --out "$work/nostream" >/dev/null 2>"$work/nostream.err" || rc=$?
[[ $rc == 1 ]] && grep -q "no request completed; the first error: stream" "$work/nostream.err" ||
  { echo "no-stream: exit $rc"; cat "$work/nostream.err"; exit 1; }
check "$work/nostream/results.json" '
  const p = r.configs[0].runs[0];
  if (!(p.errors.by_kind.stream > 0) || p.requests !== 0) fail(`no-stream: ${JSON.stringify(p.errors)}`);'

if [[ -f "$traces/trace_0291.json" ]]; then
  echo "== a recorded trace with subagents"
  start_server --tps 300
  "$cedar" bench --url "http://127.0.0.1:$port" "${quick[@]}" --traces "$traces/trace_0291.json" \
    --concurrency 2 --api responses --label trace --no-random-start --out "$work/trace" \
    >/dev/null 2>"$work/trace.err" || { cat "$work/trace.err"; exit 1; }
  check "$work/trace/results.json" '
    const p = r.configs[0].runs[0];
    if (p.errors.total !== 0 || !(p.requests > 0)) fail(`trace: ${p.requests} requests, ${JSON.stringify(p.errors)}`);'
  grep -q '1 sessions, turns median 20' "$work/trace.err" || { echo "trace summary wrong"; cat "$work/trace.err"; exit 1; }
fi

echo "== compare"
"$cedar" bench compare --out "$work/cmp" "$work/sweep" "$work/short" >/dev/null
check "$work/cmp/compare.json" '
  if (!(r.bound_tok_s_user > 0)) fail("no bound");
  if (!(r.a.output_tokens_per_s > 0 && r.b.output_tokens_per_s > 0)) fail(`throughputs ${JSON.stringify(r)}`);
  if (Math.abs(r.ratio_b_over_a - r.b.output_tokens_per_s / r.a.output_tokens_per_s) > 1e-3 * r.ratio_b_over_a) fail("ratio");'
[[ "$(grep -c '<polyline' "$work/cmp/curve.svg")" -ge 2 ]] || { echo "compare curve.svg: expected curves"; exit 1; }

echo "== a server that does not answer"
rc=0
"$cedar" bench --url "http://127.0.0.1:1" "${quick[@]}" --concurrency 1 --out "$work/none" >/dev/null 2>"$work/none.err" || rc=$?
[[ $rc == 1 ]] && grep -q "gives no answer" "$work/none.err" || { echo "unreachable server: exit $rc"; cat "$work/none.err"; exit 1; }
rc=0
"$cedar" bench --url "http://127.0.0.1:1" --model m "${quick[@]}" --concurrency 1 --out "$work/none2" >/dev/null 2>"$work/none2.err" || rc=$?
[[ $rc == 1 ]] && grep -q "no request completed" "$work/none2.err" || { echo "unreachable server, --model given: exit $rc"; cat "$work/none2.err"; exit 1; }
echo "bench_standin: ok"
