#!/usr/bin/env bash
# deps.sh - install what hotmoe needs to build and test on Debian 12, skipping what is present.
# Usage: scripts/deps.sh [--test]   (--test adds the test-only tools: clang/libFuzzer, node/npm, curl,
# python3 (the server tests' raw-socket clients), chromium)
set -euo pipefail
pkgs=(build-essential cmake pkg-config libpcre2-dev libjansson-dev libmicrohttpd-dev liburing-dev)
if [ "${1:-}" = "--test" ]; then
  pkgs+=(clang libclang-rt-14-dev nodejs npm curl jq python3 chromium chromium-driver)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node may come from elsewhere (nodesource, nvm): accept a working node+npm instead of Debian's.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=()
  for p in "${missing[@]}"; do [ "$p" = nodejs ] || [ "$p" = npm ] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
