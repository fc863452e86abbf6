#!/usr/bin/env bash
# Builds blockspec and runs the test suite (CPU). Usage: scripts/test.sh [ctest args...]
# e.g. scripts/test.sh -L unit, scripts/test.sh -LE slow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
