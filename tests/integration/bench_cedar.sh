#!/usr/bin/env bash
# `cedar bench` against `cedar serve --model micro` on the CPU: a sweep over concurrency 1..16 on
# Chat Completions with scaled synthetic sessions. Checks results.json for one point per
# concurrency, zero errors, positive throughput, ordered latency percentiles and a prefix hit rate
# read from cedar's /metrics.
# usage: bench_cedar.sh path/to/cedar
set -euo pipefail
cedar="$(realpath "${1:?usage: bench_cedar.sh path/to/cedar}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CEDAR_ROOT="${CEDAR_ROOT:-$(cd "$here/../.." && pwd)}"
source "$here/serve_lib.bash"

start_server micro --model micro

# Small prompts (scale 0.003, every session from its first turn) so that 16 lanes on 2 cores send
# and finish requests inside a 6 s window; think times shrunk so the lanes keep the server busy.
# 5 x (3 + 6) = 45 s of sweep plus the server start.
"$cedar" bench --url "$url_micro" --traces synthetic --sessions 32 --scale 0.003 --no-random-start \
  --think-scale 0.01 --max-think 0.05 --concurrency 1,2,4,8,16 --warmup 3 --duration 6 \
  --timeout 60 --api chat --label micro --out "$tmp/sweep" >/dev/null 2>"$tmp/bench.log" \
  || { cat "$tmp/bench.log"; exit 1; }

node -e '
  const fs = require("fs");
  const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  let bad = 0;
  const fail = (what) => { console.error("bench_cedar: " + what); bad++; };
  const ordered = (q) => q && q.p50 > 0 && q.p50 <= q.p90 && q.p90 <= q.p99;
  if (r.configs.length !== 1) fail(`expected 1 config, got ${r.configs.length}`);
  const runs = r.configs[0].runs;
  if (runs.map((p) => p.concurrency).join() !== "1,2,4,8,16") fail(`concurrency ${runs.map((p) => p.concurrency)}`);
  for (const p of runs) {
    console.log(`c=${p.concurrency}: ${p.requests} requests, ${p.output_tokens_per_s.toFixed(1)} output tok/s, ` +
      `ttft p50/p90 ${p.ttft_ms.p50}/${p.ttft_ms.p90} ms, itl p90 ${p.itl_ms.p90} ms, hit ${p.prefix_cache_hit_rate}`);
    const at = `c=${p.concurrency}`;
    if (p.errors.total !== 0) fail(`${at}: errors ${JSON.stringify(p.errors)}`);
    if (!(p.requests > 0)) fail(`${at}: no requests finished in the window`);
    if (!(p.output_tokens_per_s > 0)) fail(`${at}: output tok/s ${p.output_tokens_per_s}`);
    if (!ordered(p.ttft_ms)) fail(`${at}: ttft ${JSON.stringify(p.ttft_ms)}`);
    if (!ordered(p.itl_ms)) fail(`${at}: itl ${JSON.stringify(p.itl_ms)}`);
    const h = p.prefix_cache_hit_rate;
    if (!(typeof h === "number" && h >= 0 && h <= 1)) fail(`${at}: prefix hit rate ${h}`);
  }
  process.exit(bad ? 1 : 0);
' "$tmp/sweep/results.json"
echo "bench_cedar: ok"
