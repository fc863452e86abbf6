#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking the carried dist.tar.xz into
# build-cuda/ (make_dist.sh's dist plus, as dist/blockspec_old, the blockspec of the commit
# before; kprof.so and libcupti.so.13 in $KP): session 11, branch d2cost11 (issue 14: DFlash2's
# own cost in a speculative step). Sections, in this order:
#   tests - (while the synthetic checkpoints are written) the CUDA tests whose names match
#           TESTS_FILTER_OPS / TESTS_FILTER_MODELS, one process per test (run_session7.sh's way),
#   prof  - synthetic Qwen3-8B (bf16) with DFlash-b16 and DFlash2-b16 forced 100 %: `bench
#           --gemv auto` under tools/kprof (per-kernel GPU time) with blockspec_old (DFlash and
#           DFlash2) and the new blockspec (DFlash2); a draft step's share of a drafter kernel is
#           its launches / (warmup + iters + the end-to-end proposes),
#   pair  - REPEATS (3) alternating DFlash-b16 / DFlash2-b16 benches with the new blockspec.
#   KP=... bash run_d2cost11.sh [tests] [prof] [pair]
# Files into $OUT: session.txt, kprof_*.txt, test logs, logs.tgz.
set -u
T0=$SECONDS
ARGS="${*:-tests prof pair}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
L=/tmp/d2c; rm -rf $L; mkdir -p $L/steps $L/kprof
S=/dev/shm/synth
BOLD=$D/blockspec_old
[ -e ${KP:-/nonexistent}/kprof.so ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
(timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
   > $L/steps/synth.txt 2>&1 || tail -3 $L/steps/synth.txt
 timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
   --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt) &
SYNTH_PID=$!
if want tests; then
  echo "== tests ($((SECONDS - T0)) s)"
  mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"
  for spec in cuda_ops_test:${TESTS_FILTER_OPS:-.} cuda_models_test:${TESTS_FILTER_MODELS:-.}; do
    bin=${spec%%:*}; filter=${spec#*:}; log=$OUT/$bin.txt; : > $log
    for t in $($D/$bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | grep -E "$filter"); do
      timeout 100 $D/$bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
    done
    echo "== $bin: $(grep -c '^\[       OK' $log) ok, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed, $(grep -c '^\[  SKIPPED \] [A-Z]' $log) skipped ($((SECONDS - T0)) s)"
    grep -E "^!!!|Failure|Expected|Which is" -A1 $log | head -20
  done
fi
wait $SYNTH_PID; echo "synth done ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
DF=$S/qwen3-8b-dflash-b16-acc100
bench() {  # name binary drafter_dir [kprof]
  local cmd=(timeout 60 $2 bench $M --drafter $3 --device cuda --iters ${ITERS:-20} --context 512
    --gen-tokens ${GEN:-64} --gemv auto)
  if [ "${4:-}" = kprof ] && [ -e ${KP:-/nonexistent}/kprof.so ]; then
    CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$L/kprof/$1.txt "${cmd[@]}" > $L/steps/bench_$1.txt 2>&1
    echo "-- $1 rc=$? ($((SECONDS - T0)) s)"
    cp $L/kprof/$1.txt $OUT/kprof_$1.txt 2>/dev/null
  else
    "${cmd[@]}" > $L/steps/bench_$1.txt 2>&1
    echo "-- $1 rc=$? ($((SECONDS - T0)) s)"
  fi
  grep -E "verify step \(16 rows, taps|draft step|context update|speculative step|^generate \(spec|output ==|error" $L/steps/bench_$1.txt
}
if want prof; then
  echo "== prof ($((SECONDS - T0)) s)"
  bench old_dflash $BOLD $DF kprof
  bench old_dflash2 $BOLD $S/dflash2-b16 kprof
  bench new_dflash2 $B $S/dflash2-b16 kprof
fi
if want pair; then
  echo "== pair ($((SECONDS - T0)) s)"
  for i in $(seq ${REPEATS:-3}); do
    bench dflash_$i $B $DF
    bench dflash2_$i $B $S/dflash2-b16
  done
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "d2cost11 total $((SECONDS - T0)) s"
