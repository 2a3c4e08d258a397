#!/bin/bash
# gpu_sanitize.sh: compute-sanitizer over the GPU op tests, on the H200 machine, from the
# repository root with the cedar bundle carried (BUNDLE, default .gpu-gpucheck; see GPU.md).
#   memcheck and racecheck: every test case of cedar_gpu_tests except the whole-model, serving,
#     NCCL and host-only libm ones (ops_test.cpp, fast_*_test.cpp, sampling_test.cpp), one process
#     per test case and tool, JOBS (default 8) at a time
#   CASES: an extended regular expression; only the op cases whose names match (default all)
#   memcheck on the whole-model and serving tests that use micro only (MODEL_CASES: prefill,
#     host KV, forward_sample, decode under CUDA graphs, the engine on the GPU shard, page
#     copies), when SANITIZE_MODEL=1 (default)
# Each process runs under its own timeout (CASE_TIMEOUT_S, default 150) and the whole run stops
# starting new ones BUDGET_S (default 240) seconds in. Full logs: $OUT/sanitize_memcheck.txt,
# $OUT/sanitize_racecheck.txt; the table (tool, case, exit status, seconds, sanitizer summary,
# doctest result) goes to $OUT/sanitize_table.txt and is printed last.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/gpu_sanitize_out}"
bundle="${BUNDLE:-.gpu-gpucheck}"
sanitizer="${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
max_jobs="${JOBS:-8}"
case_timeout="${CASE_TIMEOUT_S:-150}"
deadline=$((SECONDS + ${BUDGET_S:-240}))
model_cases="${MODEL_CASES:-gpu model: prefill*|gpu model with host KV*|gpu model: forward_sample*|gpu model: decode steps*|gpu serve: the engine*|gpu serve: page copies*}"
work="$(mktemp -d)"
export CEDAR_GPU_TEST_QUICK=1  # tests with a quick mode (sampling_test.cpp) take it
mkdir -p "$out"
[[ -x $sanitizer ]] || { echo "gpu_sanitize: no $sanitizer" >&2; exit 1; }

# The op test cases, each as a doctest filter: its name up to the first comma (doctest splits
# filters at commas), then '*'.
mapfile -t cases < <(bash "$bundle/run" cedar_gpu_tests -ltc 2>/dev/null |
  grep -vE '^\[doctest\]|^=+$|^$|^gpu model|^gpu serve|^nccl|^expf and log1pf' | grep -E "${CASES:-.}" | sed 's/,.*//; s/$/*/')
((${#cases[@]})) || { echo "gpu_sanitize: cedar_gpu_tests -ltc listed no cases" >&2; exit 1; }

# one line per job: tool<TAB>filter
{  # the model cases first: they take the longest
  if [[ ${SANITIZE_MODEL:-1} == 1 ]]; then
    IFS='|' read -ra mc <<< "$model_cases"
    for c in "${mc[@]}"; do printf 'memcheck\t%s\n' "$c"; done
  fi
  for c in "${cases[@]}"; do printf 'memcheck\t%s\n' "$c"; done
  for c in "${cases[@]}"; do printf 'racecheck\t%s\n' "$c"; done
} > "$work/jobs.tsv"

run_one() {  # tool filter index
  local tool=$1 filter=$2 i=$3 log="$work/$(printf %03d "$i").log" t=$SECONDS rc
  if ((SECONDS >= deadline)); then
    printf '%s\t%s\tskipped\t0\tno time left\t-\n' "$tool" "$filter" > "$log.row"; return
  fi
  local extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report analysis)
  {
    echo "=== $tool: cedar_gpu_tests -tc=\"$filter\""
    timeout -k 10 "$case_timeout" bash "$bundle/run" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 86 \
      --print-limit 20 "$bundle/cedar_gpu_tests" -tc="$filter"
    echo "=== exit status $?"
  } > "$log" 2>&1
  rc=$(grep -oE '^=== exit status [0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  local summary doctest
  summary=$(grep -hoE '(ERROR SUMMARY|RACECHECK SUMMARY): .*' "$log" | tail -1)
  doctest=$(grep -oE 'test cases: *[0-9]+ *\| *[0-9]+ passed *\| *[0-9]+ failed' "$log" | tail -1 | tr -s ' ')
  ((rc == 124)) && summary="timed out after ${case_timeout} s"
  [[ $doctest == "test cases: 0 "* ]] && rc=no-case
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$filter" "$rc" "$((SECONDS - t))" "${summary:-none}" "${doctest:--}" \
    > "$log.row"
}
i=0 running=0
while IFS=$'\t' read -r tool filter; do
  i=$((i + 1))
  if ((running >= max_jobs)); then wait -n; running=$((running - 1)); fi
  run_one "$tool" "$filter" "$i" &
  running=$((running + 1))
done < "$work/jobs.tsv"
wait

for tool in memcheck racecheck; do
  : > "$out/sanitize_$tool.txt"
  for log in "$work"/*.log; do
    head -1 "$log" | grep -q "^=== $tool:" && cat "$log" >> "$out/sanitize_$tool.txt"
  done
done
{
  printf 'tool\tcase\texit\ts\tsanitizer\tdoctest\n'
  cat "$work"/*.row
} | sed 's/\t/ | /g' > "$out/sanitize_table.txt"
bad=$(cat "$work"/*.row | awk -F'\t' '$3 != 0' | wc -l)
rm -rf "$work"
echo "gpu_sanitize: $(grep -c . "$out/sanitize_table.txt" | awk '{print $1 - 1}') runs, $bad not clean (exit status != 0)"
cat "$out/sanitize_table.txt"
((bad == 0))
