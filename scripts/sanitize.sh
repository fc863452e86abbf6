#!/usr/bin/env bash
# ASan + UBSan build of the CPU code (UB aborts, no recovery) in its own build directory, then the
# unit and e2e suites under it. `slow`-labelled tests are left out (they repeat what the Release
# run covers at sizes that take minutes under the sanitizers). docs/RELIABILITY.md.
#
#   scripts/sanitize.sh [ctest args...]      (build dir: $SANITIZE_BUILD_DIR, default build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SANITIZE_BUILD_DIR:-build-asan}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" -DBLOCKSPEC_SANITIZE=ON -DBLOCKSPEC_CUDA=OFF \
  -DBLOCKSPEC_WERROR=OFF "${launcher[@]}" >/dev/null
# Only what the unit and e2e suites run: their test programs and the CLI the e2e tests start;
# and the CUDA test programs, not run here but built, because this build has no CUDA: a machine
# without nvcc builds them too (the README's build command builds every target).
targets=(blockspec)
for f in tests/unit/*.cc tests/e2e/*.cc tests/cuda/*.cc; do
  layer=${f#tests/}
  layer=${layer%%/*}
  stem=$(basename "$f" .cc)
  targets+=("${layer}_${stem}")
done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -L '^(unit|e2e)$' -LE '^slow$' "$@"
