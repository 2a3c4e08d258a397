#!/usr/bin/env bash
# `cedar gpu-bench` on the CPU model with tiny sizes: every phase runs and reports positive
# times, decoder truncation runs fewer rows, a prefix hit with bounded replay
# reaches its first token sooner than the cold prefill; and the floor phase gives the
# bench-40L-E64 decode floor of docs/BENCHMARKS.md (12,916 MB at batch 1, 8K context: wo_a
# counted as the FP8 it is stored in). --layout's usage errors.
# usage: tests/integration/gpu_bench_cpu.sh path/to/cedar
set -euo pipefail
cedar="${1:?usage: gpu_bench_cpu.sh path/to/cedar}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$cedar" gpu-bench --model bench-40L-E64 --phases floor --batch 1,64,256 --context 8192 --out "$tmp/floor.json" > /dev/null
"$cedar" gpu-bench --device cpu --model micro --batch 1,4 --context 300 --steps 2 --warmup-steps 1 \
  --prefill 300 --chunk 128 --prefix-tokens 256 --new-tokens 40 --gen-prompt 300 --gen-tokens 4 \
  --out "$tmp/run.json" > "$tmp/table.txt"

python3 - "$tmp/floor.json" "$tmp/run.json" <<'PY'
import json, sys
floor = json.load(open(sys.argv[1]))
f = {d["batch"]: d for d in floor["floor"]}
assert abs(f[1]["floor_bytes"] / 1e6 - 12916) < 2, f[1]["floor_bytes"]
assert f[1]["experts_touched_per_layer"] == 6, f[1]
assert f[1]["floor_bytes"] < f[64]["floor_bytes"] < f[256]["floor_bytes"], [f[b]["floor_bytes"] for b in f]
assert 25e9 < floor["linear_flops_per_token"] < 40e9, floor["linear_flops_per_token"]

r = json.load(open(sys.argv[2]))
for phase in ("decode", "prefill", "truncation", "prefix", "generate"):
    assert r[phase], f"phase {phase} missing"
assert [d["batch"] for d in r["decode"]] == [1, 4], r["decode"]
for d in r["decode"]:
    assert d["step_ms"] > 0 and d["tok_s"] > 0 and d["floor_bytes"] > 0, d
p = r["prefill"][0]
assert p["tokens"] == 300 and p["seconds"] > 0 and p["linear_flops"] > 0 and not p["truncated"], p
t = r["truncation"][0]
assert t["truncated"]["rows_total"] < t["full"]["rows_total"], t
assert t["truncated"]["seconds"] > 0 and t["full"]["seconds"] > 0, t
x = r["prefix"][0]
assert x["replay_tokens"] == 8, x  # micro's window
assert 0 < x["hit_ttft_s"] < x["cold_ttft_s"], x
g = r["generate"][0]
assert g["load_s"] > 0 and g["prefill_s"] > 0 and g["decode_tok_s"] > 0, g
PY
grep -q "prefix hit" "$tmp/table.txt" || { cat "$tmp/table.txt"; exit 1; }

# --layout needs the GPU's fast kernels and only runs the floor and decode phases: anything else
# is a usage error (exit 2) that says so; without a device, a clear error (exit 1)
for bad in "--layout tp2" "--device cuda --layout tp2 --phases prefill" "--device cuda --layout tpx" \
           "--device cuda --gpu-kernels exact --layout dep2 --phases decode"; do
  set +e; "$cedar" gpu-bench --model micro $bad > /dev/null 2> "$tmp/err.txt"; rc=$?; set -e
  [[ $rc == 2 ]] && grep -q -- "--layout tpN|depN" "$tmp/err.txt" ||
    { echo "gpu-bench $bad: rc $rc"; cat "$tmp/err.txt"; exit 1; }
done
# (the machines the tests run on have fewer than two CUDA devices)
set +e
"$cedar" gpu-bench --model micro --device cuda --layout dep2 --phases decode > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[[ $rc == 1 ]] && grep -q "device" "$tmp/err.txt" ||
  { echo "gpu-bench --layout without devices: rc $rc"; cat "$tmp/err.txt"; exit 1; }
echo "gpu_bench_cpu: ok"
