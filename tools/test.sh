#!/usr/bin/env bash
# README command two: installs everything, builds, and runs every test (unit, then integration).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"
build="${CEDAR_BUILD_DIR:-$root/build}"
echo "== unit tests"
(cd "$build" && ctest --output-on-failure -L unit -j "$(nproc)")
if [[ -x "$root/tests/integration/run.sh" ]]; then
  echo "== integration tests"
  bash "$root/tests/integration/run.sh" "$build/cedar"
fi
