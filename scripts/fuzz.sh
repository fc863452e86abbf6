#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang and -fsanitize=fuzzer,address,undefined
# (UB aborts) in their own build directory, then runs each for SECONDS over a working corpus
# seeded from tests/fuzz/corpus/<name>/ (the seeds, regression inputs included, run first).
# A crash, leak, timeout or out-of-memory stops that harness, leaves its input under
# $FUZZ_BUILD_DIR/artifacts/<name>/ and makes the script exit 1. docs/RELIABILITY.md.
#
#   scripts/fuzz.sh [SECONDS] [NAME...]      (default 60 s each, every harness)
#   FUZZ_BUILD_DIR=build-fuzz FUZZ_ARGS="-runs=10000000" scripts/fuzz.sh 0 safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
all=(safetensors hf_config tokenizer_json tokenizer_encode jinja_template chat_render openai_request)
names=("$@")
((${#names[@]})) || names=("${all[@]}")
build=${FUZZ_BUILD_DIR:-build-fuzz}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DBLOCKSPEC_FUZZ=ON -DBLOCKSPEC_CUDA=OFF -DBLOCKSPEC_TESTS=OFF -DBLOCKSPEC_WERROR=OFF \
  "${launcher[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${names[@]/%/_fuzz}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for n in "${names[@]}"; do
  mkdir -p "$build/corpus/$n" "$build/artifacts/$n"
  time_flag=()
  ((secs > 0)) && time_flag=(-max_total_time="$secs")
  echo "fuzz: $n (${secs}s)"
  # shellcheck disable=SC2086
  if ! "$build/tests/fuzz/${n}_fuzz" "$build/corpus/$n" "tests/fuzz/corpus/$n" "${time_flag[@]}" \
      -timeout=20 -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$n/" ${FUZZ_ARGS:-} >"$build/$n.log" 2>&1; then
    failed+=("$n")
    tail -60 "$build/$n.log"
  fi
  grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^Done [0-9]+ runs" \
    "$build/$n.log" | tr '\n' ' '
  echo
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs under $build/artifacts/)"
  exit 1
fi
echo "fuzz: ${#names[@]} harnesses clean"
