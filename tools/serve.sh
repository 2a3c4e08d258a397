#!/usr/bin/env bash
# README command one: installs everything, builds, and runs cedar on the embedded default
# model. Arguments are passed to the command (default: serve).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"
build="${CEDAR_BUILD_DIR:-$root/build}"
if (($#)); then exec "$build/cedar" "$@"; fi
if "$build/cedar" --help | grep -q "^  serve "; then exec "$build/cedar" serve; fi
exec "$build/cedar" generate --prompt "Hello from cedar" --max-tokens 32
