#!/bin/bash
# Runs on the GPU machine from the repo root (any checkout: the binaries are carried): session 12,
# branch dsprune12 (issue 14: DSpark's Markov chain at <= 2 % of a speculative step). Unpacks
# $PK/dist.tar.xz (make_dist.sh's dist of the branch, plus dist/blockspec_old = main at c7e3448 and
# dist/cuda_ops_test_mutant = cuda_ops_test built with the bound's factor set to 0, which must
# fail MarkovChainPrunedEqualsMarkovRows) into build-cuda/; kprof.so + libcupti.so.13 in $PK/kprof.
# Sections, in this order:
#   tests - (while the synthetic Qwen3-8B + DSpark-b7 are written) the CUDA tests matching
#           TESTS_FILTER_OPS / TESTS_FILTER_MODELS, one process per test; then the mutant,
#   prof  - `bench --drafter dspark-b7` under tools/kprof with blockspec_old and the new blockspec
#           (per-kernel GPU time: markov_row vs markov_u_argmax + markov_prune_row, the copies),
#   pair  - REPEATS (3) alternating old / new benches without the profiler.
#   PK=build-cuda/dsprune12 bash run_dsprune12.sh [tests] [prof] [pair]
# Files into $OUT: session.txt, kprof_*.txt, test logs, logs.tgz. Stops starting sections after
# LIMIT_S (default 300) seconds.
set -u
T0=$SECONDS
ARGS="${*:-tests prof pair}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
PK=${PK:-build-cuda/dsprune12}
LIMIT_S=${LIMIT_S:-300}
mkdir -p build-cuda && rm -rf build-cuda/dist && tar -xJf $PK/dist.tar.xz -C build-cuda
KP=$PWD/$PK/kprof
. tools/device/device_env.sh
start_session $OUT/session.txt
L=/tmp/dsp; rm -rf $L; mkdir -p $L/steps $L/kprof
S=/dev/shm/synth
DS=$S/dspark-b7
BOLD=$D/blockspec_old
[ -e $KP/kprof.so ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
(timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dspark-b7 --acceptance 100 \
   --drafter-out $DS > $L/steps/synth.txt 2>&1 || tail -3 $L/steps/synth.txt) &
SYNTH_PID=$!
run_tests() {  # binary filter log
  local bin=$1 filter=$2 log=$3; : > $log
  for t in $($D/$bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | grep -E "$filter"); do
    timeout 100 $D/$bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
  done
  echo "== $bin ($filter): $(grep -c '^\[       OK' $log) ok, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed, $(grep -c '^\[  SKIPPED \] [A-Z]' $log) skipped ($((SECONDS - T0)) s)"
}
if want tests; then
  echo "== tests ($((SECONDS - T0)) s)"
  mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"
  run_tests cuda_ops_test "${TESTS_FILTER_OPS:-Markov|CandidateWalk|RelativeOps|TopkLong|Captured}" $OUT/cuda_ops_test.txt
  grep -E "^!!!|Failure|Expected|Which is" -A1 $OUT/cuda_ops_test.txt | head -20
  run_tests cuda_models_test "${TESTS_FILTER_MODELS:-Relatives|Speculative}" $OUT/cuda_models_test.txt
  grep -E "^!!!|Failure|Expected|Which is" -A1 $OUT/cuda_models_test.txt | head -20
  grep -E "^\[ .*(dspark|drafts equal|acceptance)" $OUT/cuda_models_test.txt | head -20
  # The mutant (no bound: only ids with u >= pred(z*) kept) must fail the pruned-chain test.
  timeout 100 $D/cuda_ops_test_mutant --gtest_filter='*MarkovChainPruned*' > $L/steps/mutant.txt 2>&1
  echo "== mutant rc=$? ($(grep -c 'Expected equality' $L/steps/mutant.txt) failed expectations; must be > 0)"
fi
wait $SYNTH_PID; echo "synth done ($((SECONDS - T0)) s)"; ls $DS > /dev/null || exit 1
M="--model $S/qwen3-8b"
bench() {  # name binary [kprof]
  local cmd=(timeout 60 $2 bench $M --drafter $DS --device cuda --iters ${ITERS:-20} --context 512
    --gen-tokens ${GEN:-64} --gemv auto)
  if [ "${3:-}" = kprof ] && [ -e $KP/kprof.so ]; then
    CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_TOP=80 KPROF_OUT=$L/kprof/$1.txt "${cmd[@]}" \
      > $L/steps/bench_$1.txt 2>&1
    echo "-- $1 rc=$? ($((SECONDS - T0)) s)"
    cp $L/kprof/$1.txt $OUT/kprof_$1.txt 2>/dev/null
    grep -iE "markov|memcpy|memset|busy" $L/kprof/$1.txt | head -12
  else
    "${cmd[@]}" > $L/steps/bench_$1.txt 2>&1
    echo "-- $1 rc=$? ($((SECONDS - T0)) s)"
  fi
  grep -E "verify step|draft step|context update|speculative step|^generate \(spec|output ==|error" \
    $L/steps/bench_$1.txt
}
if want prof && [ $((SECONDS - T0)) -lt $LIMIT_S ]; then
  echo "== prof ($((SECONDS - T0)) s)"
  bench prof_old $BOLD kprof
  bench prof_new $B kprof
fi
if want pair; then
  echo "== pair ($((SECONDS - T0)) s)"
  for i in $(seq ${REPEATS:-3}); do
    [ $((SECONDS - T0)) -lt $LIMIT_S ] || { echo "(pair $i skipped: limit)"; break; }
    bench old_$i $BOLD
    bench new_$i $B
  done
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "dsprune12 total $((SECONDS - T0)) s"
