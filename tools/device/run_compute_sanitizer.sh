#!/bin/bash
# Runs on the GPU machine from the repo root (docs/RELIABILITY.md, "compute-sanitizer on GPU"):
#   1. memcheck (with leak check) over the whole cuda_ops_test; a finding that loses the CUDA
#      context ends that process, so the run resumes after the test it was in, up to 4 times,
#      until every test ran, the two slowest last (MEMCHECK_S caps the whole step);
#   2. memcheck over one speculative `blockspec generate --device cuda` with stories260K and its
#      DFlash drafter (GENERATE_S);
#   3. racecheck over cuda_ops_test, one process per test (RACECHECK_TEST_S each, RACECHECK_S
#      for the step): the kernels that share memory between threads first (attention, flash
#      prefill, norms, sampling, top-k, relatives' ops), then the rest, the slowest under the tool
#      (DeviceDrawsFollowTheFilteredDistribution) last.
# Binaries: the carried build-cuda/dist (docs/CUDA.md) when present, else build/ (a build made on
# the machine). Logs under $OUT (cuda_ops_memcheck.txt, cuda_ops_racecheck.txt,
# generate_memcheck.txt, env.txt); each line "<what> rc=N" is 0 when clean (--error-exitcode 99
# on findings). Default caps: 130 + 60 + 110 s, under 5 minutes in all.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
if [ -d build-cuda/dist ]; then
  . tools/device/device_env.sh
  T=$D/cuda_ops_test
else
  B=build/blockspec
  T=build/tests/cuda_cuda_ops_test
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$CS" --version | tail -1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/env.txt"
T0=$SECONDS
# SKIP_TESTS: tests left out (space-separated full names), e.g. the one that measures the GPU's
# free memory when another process shares the GPU (run_session8.sh).
tests=$("$T" --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' |
  grep -vxF -f <(echo ${SKIP_TESTS:-} | tr ' ' '\n' | grep .))

# 1. memcheck, resuming after a test that ended the process.
MC=$OUT/cuda_ops_memcheck.txt
: > "$MC"
# The two slowest under the tools (a statistical sampling test, a timing test) run last.
slow=$(echo "$tests" | grep -E 'DeviceDraws|OpTimes' | tr '\n' ' ')
done_tests="$slow ${SKIP_TESTS:-}"
rc_all=0
for attempt in 1 2 3 4 5; do
  left=$((${MEMCHECK_S:-130} - (SECONDS - T0)))
  ((left < 10)) && { echo "memcheck: cap reached" >> "$MC"; rc_all=124; break; }
  neg=$(echo $done_tests | tr ' ' ':')
  echo "=== memcheck attempt $attempt (skipping: ${neg:-none})" >> "$MC"
  timeout $left "$CS" --tool memcheck --leak-check full --error-exitcode 99 --print-limit 40 \
    "$T" --gtest_filter="*${neg:+-$neg}" >> "$MC" 2>&1
  rc=$?
  ((rc != 0)) && rc_all=$rc
  # Every test that started in this attempt is done (the one that ended the process included).
  done_tests="$done_tests $(grep -oE '^\[ RUN      \] [A-Za-z0-9_.]+' "$MC" | awk '{print $4}' | sort -u | tr '\n' ' ')"
  done_tests=$(echo $done_tests | tr ' ' '\n' | sort -u | tr '\n' ' ')
  [ -z "$(echo "$tests" | grep -vxF -f <(echo $done_tests | tr ' ' '\n'))" ] && break
  ((rc == 0 || rc == 124)) && break
done
left=$((${MEMCHECK_S:-130} - (SECONDS - T0)))
if [ -n "$slow" ] && ((left >= 10)); then
  echo "=== memcheck, the slow tests: $slow" >> "$MC"
  timeout $left "$CS" --tool memcheck --leak-check full --error-exitcode 99 --print-limit 40 \
    "$T" --gtest_filter="$(echo $slow | tr ' ' ':')" >> "$MC" 2>&1
  rc=$?
  ((rc != 0)) && rc_all=$rc
fi
echo "cuda_ops_test memcheck rc=$rc_all: $(grep -c '^\[       OK' "$MC") ok, $(grep -c '^\[  FAILED  \] [A-Z]' "$MC") failed of $(echo $tests | wc -w) tests, $(grep -c '^========= Invalid\|^========= Program hit\|^========= Leaked' "$MC") reports ($((SECONDS - T0)) s)"
grep -E "^========= (Invalid|Program hit|Leaked|ERROR SUMMARY|LEAK SUMMARY)|^=========     at |^\[ RUN|^=== memcheck" "$MC" | uniq | head -24

# 2. memcheck over one speculative generate.
T1=$SECONDS
timeout ${GENERATE_S:-60} "$CS" --tool memcheck --leak-check full --error-exitcode 99 \
  "$B" generate --model models/stories260K --drafter models/stories260K-dflash --device cuda \
  --prompt "Tom had a red" --max-tokens 48 --temperature 0 > "$OUT/generate_memcheck.txt" 2>&1
echo "generate --device cuda (DFlash) memcheck rc=$? ($((SECONDS - T1)) s)"
tail -3 "$OUT/generate_memcheck.txt"

# 3. racecheck, one process per test, shared-memory kernels first.
T2=$SECONDS
RC=$OUT/cuda_ops_racecheck.txt
: > "$RC"
first=$(echo "$tests" | grep -E 'Attention|Prefill|Norm|Sampl|Filtered|Softmax|Relative|Argmax|Greedy|Rejection|Swiglu|Captured' | grep -v DeviceDraws)
rest=$(echo "$tests" | grep -vxF -f <(echo "$first") | grep -v DeviceDraws)
ran=0; clean=0; hazards=0; stopped=""
last=$(echo "$tests" | grep DeviceDraws)
for t in $first $rest $last; do
  left=$((${RACECHECK_S:-110} - (SECONDS - T2)))
  ((left < 5)) && { stopped="$stopped $t"; continue; }
  lim=${RACECHECK_TEST_S:-30}; ((lim > left)) && lim=$left
  echo "=== racecheck $t" >> "$RC"
  timeout $lim "$CS" --tool racecheck --racecheck-report all --error-exitcode 99 --print-limit 20 \
    "$T" --gtest_filter="$t" >> "$RC" 2>&1
  r=$?
  ran=$((ran + 1))
  case $r in
    0) clean=$((clean + 1)) ;;
    124) stopped="$stopped $t(timeout)" ;;
    *) hazards=$((hazards + 1)); echo "!!! $t rc=$r" >> "$RC" ;;
  esac
done
echo "cuda_ops_test racecheck: $clean of $ran tests clean, $hazards with hazards or failures, not finished:${stopped:- none} ($((SECONDS - T2)) s)"
grep -E "^!!!|^========= (Error|Warning|ERROR SUMMARY: [1-9])|RACECHECK SUMMARY: [1-9]" "$RC" | head -20
echo "compute-sanitizer total $((SECONDS - T0)) s"
