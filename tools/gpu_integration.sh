#!/bin/bash
# gpu_integration.sh: the Node integration clients of the CPU tests (serve_openai.mjs with the
# openai SDK, serve_websocket.mjs with the ws client) against `cedar serve --device cuda`, on the
# H200 machine, from the repository root with the cedar bundle (BUNDLE, default .gpu-gpucheck)
# and the Node bundle (NODE_BUNDLE, default .gpu-node, from tools/gpu_node_bundle.sh) carried.
# The same scripts as the CPU run (tests/integration/serve_openai.sh, serve_websocket.sh); the
# model server gets CEDAR_SERVE_MODEL_ARGS="--model M --device cuda --served-model-name tiny ..."
# (the clients ask for "tiny"), the null server stays on the CPU.
#   GPU_MODELS   models to serve (default "micro"; "micro tiny" for both)
#   GPU_KERNELS  --gpu-kernels modes, each run in turn (default "default": no flag, serve's own
#                default; e.g. "exact fast" for both)
#   GPU_SERVE_ARGS  more serve options (default "--kv-budget-bytes 1073741824", the CPU default,
#                so that several servers and tests share the device)
#   SKIP_CHECKS  checks not run on the device (default: the TP -> DEP layout switch, which needs
#                two GPUs: there, GPU_SERVE_ARGS="... --layout tp2" SKIP_CHECKS= CEDAR_LAYOUT_BACK=tp2
#                runs it, the switch going tp2 -> dep2 -> tp2)
#   GPU_DEVICE   --device of the model server (default cuda; cpu tries this script elsewhere)
#   PARALLEL     runs at once (default 4), each with its own servers; RUN_TIMEOUT_S (default 150)
#   BUDGET_S     no new run starts after this many seconds (default 200)
# Full output: $OUT/integration.txt; one line per run in $OUT/integration_table.txt, printed last.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/gpu_integration_out}"
bundle="$root/${BUNDLE:-.gpu-gpucheck}"
node_bundle="$root/${NODE_BUNDLE:-.gpu-node}"
deadline=$((SECONDS + ${BUDGET_S:-200}))
mkdir -p "$out"
log="$out/integration.txt" table="$out/integration_table.txt"
: > "$log"

# node into /tmp, the two npm packages where the clients look for them (tools/node/node_modules),
# the tokenizer for cedar serve, and a `cedar` that runs the bundle's binary with its libraries
tmp="${TMPDIR:-/tmp}/cedar-node"
mkdir -p "$tmp/bin"
xz -dc "$node_bundle/node.xz" > "$tmp/bin/node" && chmod +x "$tmp/bin/node" || exit 1
export PATH="$tmp/bin:$PATH"
if [[ ! -e tools/node/node_modules/openai/package.json ]]; then
  mkdir -p tools/node/node_modules
  xz -dc "$node_bundle/node_modules.tar.xz" | tar -C tools/node/node_modules -xf - || exit 1
fi
if [[ -z ${CEDAR_TOKENIZER:-} ]]; then
  xz -dc "$node_bundle/tokenizer.json.xz" > "$tmp/tokenizer.json" || exit 1
  export CEDAR_TOKENIZER="$tmp/tokenizer.json"
fi
# libraries carried xz-compressed to fit the carry limit (ICU's data is 30 MB, 8 MB as .xz:
# `xz -9 .gpu-gpucheck/lib/libicudata.so.*` after gpu-bundle) are unpacked in place first
for f in "$bundle"/lib/*.xz; do
  [[ -e $f ]] && { xz -dc "$f" > "${f%.xz}" && rm -f "$f" || exit 1; }
done
printf '#!/bin/bash\nexec bash %q cedar "$@"\n' "$bundle/run" > "$tmp/cedar"
chmod +x "$tmp/cedar"
echo "node $(node --version), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" | tee -a "$log"

export CEDAR_ROOT="$root"
export CEDAR_SKIP_CHECKS="${SKIP_CHECKS-^POST /admin/layout}"
serve_args="${GPU_SERVE_ARGS---kv-budget-bytes 1073741824}"
run_one() {  # model kernels client index: one client script against its own pair of servers
  local model=$1 kernels=$2 client=$3 f="$tmp/run$4" t=$SECONDS rc result
  local args="--model $model --device ${GPU_DEVICE:-cuda} --served-model-name tiny $serve_args"
  [[ $kernels != default ]] && args+=" --gpu-kernels $kernels"
  if ((SECONDS >= deadline)); then
    printf '%s\t%s\t%s\tskipped\t0\tno time left\n' "$model" "$kernels" "$client" > "$f.row"; return
  fi
  echo "=== serve_$client.sh, CEDAR_SERVE_MODEL_ARGS=\"$args\"" > "$f.txt"
  CEDAR_SERVE_MODEL_ARGS="$args" timeout -k 10 "$run_timeout" bash "tests/integration/serve_$client.sh" "$tmp/cedar" \
    >> "$f.txt" 2>&1
  rc=$?
  echo "=== exit status $rc" >> "$f.txt"
  result=$(grep -E "^serve_$client: " "$f.txt" | tail -1)
  [[ -z $result ]] && result="FAILED after $(grep -cE '^  ok  ' "$f.txt") checks ok: $(grep -m1 -E 'Error|assert' "$f.txt" | cut -c1-150)"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$kernels" "$client" "$rc" "$((SECONDS - t))" "$result" > "$f.row"
}

# every (model, kernels, client) run at once, at most PARALLEL (default 4) at a time
run_timeout="${RUN_TIMEOUT_S:-150}"
i=0 running=0
for model in ${GPU_MODELS:-micro}; do
  for kernels in ${GPU_KERNELS:-default}; do
    for client in openai websocket; do
      i=$((i + 1))
      if ((running >= ${PARALLEL:-4})); then wait -n; running=$((running - 1)); fi
      run_one "$model" "$kernels" "$client" "$(printf %03d $i)" &
      running=$((running + 1))
    done
  done
done
wait
cat "$tmp"/run*.txt >> "$log"
{ printf 'model\tkernels\tclient\texit\ts\tresult\n'; cat "$tmp"/run*.row; } | sed 's/\t/ | /g' > "$table"
failed=$(cat "$tmp"/run*.row | awk -F'\t' '$4 != 0' | wc -l)
rm -f "$tmp"/run*
echo "gpu_integration: $i runs, $failed not passed"
cat "$table"
((failed == 0))
