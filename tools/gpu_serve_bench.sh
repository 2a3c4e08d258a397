#!/bin/bash
# gpu_serve_bench.sh: the GPU serving run on the H200 machine, from the repository root with
# .gpu carried (bundle of cedar and cedar_gpu_tests plus .gpu/tokenizer.json; see GPU.md).
# Within BUDGET_S seconds (default 520), each part under its own timeout, logs under $OUT:
#   1. cedar_gpu_tests -tc="*sampl*" (device sampling vs the host sampler)
#   2. cedar generate on micro, --device cpu vs cuda: the same ids (chunked prefill + decode)
#   3. tests/integration/serve_device_check.py: cedar serve --device cpu and cuda on micro,
#      chat, chat SSE, Responses + previous_response_id, WebSocket mode; the same answers
#   4. cedar generate --model bench-40L-E64 --device cuda: random weights generated in host
#      memory and uploaded, a PROMPT_TOKENS prompt (default 8192) in 1024-token chunks, then
#      DECODE_TOKENS (default 128) greedy tokens: load, prefill and decode times
#   5. the rest of cedar_gpu_tests with the time left
set -u
out="${OUT:-/tmp/gpu_serve_out}"
mkdir -p "$out"
deadline=$((SECONDS + ${BUDGET_S:-520}))
left() { echo $((deadline - SECONDS)); }
export CEDAR_TOKENIZER="$PWD/.gpu/tokenizer.json"
run="bash .gpu/run"
summary="$out/summary.txt"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$summary"
free -g | head -2 >> "$summary"

t=$SECONDS
timeout 60 $run cedar_gpu_tests -tc="*sampl*" > "$out/gpu_tests_sampling.txt" 2>&1
note "1 sampler tests: rc=$? in $((SECONDS - t)) s: $(grep -E 'test cases' "$out/gpu_tests_sampling.txt" | tail -1)"

t=$SECONDS
ids=$(seq -s, 1000 1063)
for d in cpu cuda; do
  timeout 60 $run cedar generate --model micro --device $d --prompt-ids "$ids" --chunk 24 --max-tokens 16 \
    --ignore-eos --json > "$out/gen_micro_$d.json" 2>>"$out/gen_micro.txt"
  echo "$d rc=$?: $(cat "$out/gen_micro_$d.json")" >> "$out/gen_micro.txt"
done
a=$(grep -o '"output_ids":\[[0-9,]*\]' "$out/gen_micro_cpu.json"); b=$(grep -o '"output_ids":\[[0-9,]*\]' "$out/gen_micro_cuda.json")
if [[ -n "$a" && "$a" == "$b" ]]; then r=PASS; else r=FAIL; fi
note "2 generate micro cpu vs cuda (64-token prompt in chunks of 24, 16 tokens): $r $b ($((SECONDS - t)) s)"
rm -f "$out/gen_micro_cpu.json" "$out/gen_micro_cuda.json"

t=$SECONDS
timeout 120 python3 tests/integration/serve_device_check.py --cedar "$run cedar" --model micro --devices cpu,cuda \
  --log-dir "$out" > "$out/serve_check.txt" 2>&1
note "3 serve check: rc=$? in $((SECONDS - t)) s: $(tail -1 "$out/serve_check.txt")"

t=$SECONDS
L=$(left)
bench_s=$((L - 80)); prefill_s=$((bench_s - 150))
((prefill_s < 30)) && prefill_s=30
note "4 bench-40L-E64: ${bench_s} s allowed, prefill cut after ~${prefill_s} s"
timeout "$bench_s" $run cedar generate --model bench-40L-E64 --device cuda --seed 1 \
  --prompt-ids "$(seq -s, 1000 $((999 + ${PROMPT_TOKENS:-8192})))" --chunk 1024 --max-tokens "${DECODE_TOKENS:-128}" \
  --ignore-eos --progress --max-prefill-s "$prefill_s" > "$out/bench.txt" 2>&1
rc=$?
note "  rc=$rc in $((SECONDS - t)) s"
grep -E "generated in|on the device in|load:|prefill|decode" "$out/bench.txt" | grep -v "output ids" | tail -14 | tee -a "$summary"

t=$SECONDS
L=$(left)
if ((L > 20)); then
  timeout $((L - 5)) $run cedar_gpu_tests -tce="*sampl*" > "$out/gpu_tests.txt" 2>&1
  note "5 other GPU tests: rc=$? in $((SECONDS - t)) s: $(grep -E 'test cases' "$out/gpu_tests.txt" | tail -1)"
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$out/gpu_tests.txt" | head -10 | tee -a "$summary"
else
  note "5 other GPU tests: no time left"
fi
