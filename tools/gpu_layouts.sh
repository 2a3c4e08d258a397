#!/bin/bash
# gpu_layouts.sh N: the multi-GPU layout runs on a machine of N >= 2 GPUs, from the repository root
# with the cedar bundle (BUNDLE, default .gpu-new: cedar and cedar_gpu_tests) and the Node bundle
# (NODE_BUNDLE, default .gpu-node, tools/gpu_node_bundle.sh) carried. In order, each step's log
# under $OUT (default /tmp/gpu_layouts_out) and a summary line on stdout:
#   1. cedar_gpu_tests: the layout test (TP-2 and DEP-2 against one GPU), the split experts, NCCL
#   2. gpu-bench --layout tpN (batches TP_BATCHES, default 1,8) and depN (DEP_BATCHES, 64,256)
#      on bench-40L-E64 (MODEL), decode at 8K context
#   3. the openai and ws integration clients against --layout tpN and depN (micro), the TP -> DEP
#      switch check included (tools/gpu_integration.sh)
#   4. tests/integration/layout_switch.sh: 32 WebSocket sessions while tpN -> depN -> tpN -> depN
# STEPS picks steps (default "1 2 3 4"). NCCL runs with NVLink multicast off.
set -u
n="${1:?usage: tools/gpu_layouts.sh N (GPUs, at least 2)}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bundle="${BUNDLE:-.gpu-new}"
out="${OUT:-/tmp/gpu_layouts_out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
steps=" ${STEPS:-1 2 3 4} "
model="${MODEL:-bench-40L-E64}"
summary() { echo "gpu_layouts: $*" | tee -a "$out/summary.txt"; }

if [[ $steps == *" 1 "* ]]; then
  timeout 300 bash "$bundle/run" cedar_gpu_tests -tc="*layouts on GPUs*,*split over ranks*,nccl*" > "$out/tests.txt" 2>&1
  summary "tests rc $? ($(grep -h 'test cases:' "$out/tests.txt" | tail -1))"
fi
if [[ $steps == *" 2 "* ]]; then
  for run in "tp$n ${TP_BATCHES:-1,8}" "dep$n ${DEP_BATCHES:-64,256}"; do
    set -- $run
    timeout 420 bash "$bundle/run" cedar gpu-bench --model "$model" --device cuda --layout "$1" --phases decode \
      --batch "$2" --steps 16 --progress --out "$out/$1.json" > "$out/bench_$1.txt" 2>&1
    summary "gpu-bench $1 rc $?"
    grep -A8 "^decode (synthetic KV)" "$out/bench_$1.txt"
  done
fi
if [[ $steps == *" 3 "* ]]; then
  for layout in "tp$n" "dep$n"; do
    CEDAR_LAYOUT_BACK=$layout SKIP_CHECKS="" BUNDLE="$bundle" PARALLEL=2 RUN_TIMEOUT_S=150 BUDGET_S=300 \
      GPU_SERVE_ARGS="--kv-budget-bytes 1073741824 --layout $layout" OUT="$out/integration_$layout" \
      timeout 330 bash tools/gpu_integration.sh > "$out/integration_$layout.txt" 2>&1
    summary "integration $layout rc $? ($(grep -h '^gpu_integration:' "$out/integration_$layout.txt"))"
  done
fi
if [[ $steps == *" 4 "* ]]; then
  # node, the tokenizer and a cedar wrapper, as tools/gpu_integration.sh (step 3) unpacks them
  if [[ ! -x /tmp/cedar-node/bin/node || ! -x /tmp/cedar-node/cedar ]]; then
    summary "layout_switch skipped: it needs step 3 first (node and the tokenizer unpacked in /tmp/cedar-node)"
    cat "$out/summary.txt"
    exit 1
  fi
  PATH=/tmp/cedar-node/bin:$PATH CEDAR_TOKENIZER=/tmp/cedar-node/tokenizer.json \
    CEDAR_SERVE_MODEL_ARGS="--device cuda --kv-budget-bytes 1073741824" LAYOUT_START="tp$n" \
    LAYOUT_PLAN="dep$n,tp$n,dep$n" LAYOUT_KILL=0 LAYOUT_PAGE_TOKENS=256 LAYOUT_TEXT_MAY_DIFFER=1 \
    timeout 300 bash tests/integration/layout_switch.sh /tmp/cedar-node/cedar > "$out/switch.txt" 2>&1
  summary "layout_switch rc $?"
  grep "switch to\|failed,\|layout_switch" "$out/switch.txt"
fi
cat "$out/summary.txt"
