#!/usr/bin/env bash
# Runs every integration script in this folder against a built cedar binary.
# usage: tests/integration/run.sh path/to/cedar
# Each script gets the cedar binary as $1 and exits 0 on success.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cedar="$(realpath "${1:?usage: run.sh path/to/cedar}")"
export CEDAR_ROOT="$(cd "$here/../.." && pwd)"
export NODE_PATH="$CEDAR_ROOT/tools/node/node_modules"
passed=0; failed=0; failed_names=()
for script in "$here"/*.sh; do
  name="$(basename "$script" .sh)"
  [[ "$name" == run ]] && continue
  start=$(date +%s)
  if bash "$script" "$cedar"; then
    passed=$((passed + 1)); echo "integration: $name ok ($(( $(date +%s) - start ))s)"
  else
    failed=$((failed + 1)); failed_names+=("$name"); echo "integration: $name FAILED ($(( $(date +%s) - start ))s)"
  fi
done
((failed)) && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
((failed == 0))
