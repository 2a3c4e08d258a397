#!/bin/bash
# gpu_run.sh [BUILD_DIR]: builds the GPU tests here (nvcc, no GPU needed), bundles them with the
# libraries the H200 machine lacks into .gpu/ (git-ignored), and prints the one command to run
# there with .gpu carried along. Full output goes to $OUT/gpu_tests.txt; the per-op and
# whole-model table is printed last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-cuda}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCEDAR_CUDA=ON >/dev/null
cmake --build "$build" --target cedar_gpu_tests -j"$(nproc)"
cd "$root"
"$root/../shared/tools/gpu-bundle" .gpu "$build/cedar_gpu_tests"
cat <<'CMD'
# on the H200 machine (repository root, .gpu carried):
timeout 300 bash .gpu/run cedar_gpu_tests > $OUT/gpu_tests.txt 2>&1; echo rc=$?; grep -E "^  |^    |MESSAGE|ERROR|test cases|assertions" $OUT/gpu_tests.txt
CMD
