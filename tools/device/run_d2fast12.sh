#!/bin/bash
# Runs on the GPU machine from the repo root (session 12, branch d2fast12: issue 14's 2 % for
# DFlash2). The carried build-cuda/d2fast12/dist.tar.xz holds make_dist.sh's dist plus
# dist/blockspec_old (main at c7e3448, before the branch) and dist/kprof (kprof.so, libcupti).
# run_d2cost11.sh's sections, in this order:
#   tests - (while the synthetic checkpoints are written) the CUDA tests matching
#           TESTS_FILTER_OPS / TESTS_FILTER_MODELS, one process per test,
#   prof  - `bench --gemv auto` under tools/kprof: PROF (default: old DFlash-b16, old DFlash2-b16,
#           new DFlash2-b16),
#   pair  - REPEATS (3) rounds of DFlash-b16 (new), DFlash2-b16 (new), DFlash2-b16 (old binary),
#           DFlash2-b16 (new, BLOCKSPEC_CONV_KERNEL=generic: the generic convolution kernel).
# Benches stop being started after STOP_S seconds (the device budget). The first call (05:45 UTC)
# ran `cd5d2ba`, whose fourth pair member was BLOCKSPEC_SMALL_GEMM=matmul (the projection through
# the stream GEMM or cuBLASLt: no difference, reverted).
#   bash build-cuda/d2fast12/run.sh [tests] [prof] [pair]
set -u
T0=$SECONDS
ARGS="${*:-tests prof pair}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
mkdir -p build-cuda && tar -xJf build-cuda/d2fast12/dist.tar.xz -C build-cuda
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
echo "unpacked ($((SECONDS - T0)) s)"
KP=$PWD/$D/kprof
L=/tmp/d2f; rm -rf $L; mkdir -p $L/steps $L/kprof
BOLD=$D/blockspec_old
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
    grep -E "^!!!|Failure|Expected|Which is|differ" -A1 $log | head -30
  done
fi
wait $SYNTH_PID; echo "synth done ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
DF=$S/qwen3-8b-dflash-b16-acc100
bench() {  # name binary drafter_dir [kprof] [env assignments...]
  local name=$1 bin=$2 dir=$3 prof=${4:-}
  shift 4 2>/dev/null || shift $#
  if [ $((SECONDS - T0)) -ge ${STOP_S:-420} ]; then echo "-- $name skipped (time)"; return; fi
  local cmd=(timeout 60 env "$@" $bin bench $M --drafter $dir --device cuda --iters ${ITERS:-20}
    --context 512 --gen-tokens ${GEN:-32} --gemv auto)
  if [ "$prof" = kprof ] && [ -e $KP/kprof.so ]; then
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP CUDA_INJECTION64_PATH=$KP/kprof.so \
      KPROF_OUT=$L/kprof/$name.txt "${cmd[@]}" > $L/steps/bench_$name.txt 2>&1
    echo "-- $name rc=$? ($((SECONDS - T0)) s)"
    cp $L/kprof/$name.txt $OUT/kprof_$name.txt 2>/dev/null
  else
    "${cmd[@]}" > $L/steps/bench_$name.txt 2>&1
    echo "-- $name rc=$? ($((SECONDS - T0)) s)"
  fi
  grep -E "verify step \(16 rows, taps|draft step|context update|speculative step|^generate \(spec|output ==|error" $L/steps/bench_$name.txt
}
if want prof; then
  echo "== prof ($((SECONDS - T0)) s)"
  for p in ${PROF:-old_dflash old_dflash2 new_dflash2}; do
    case $p in
      old_dflash) bench old_dflash $BOLD $DF kprof ;;
      old_dflash2) bench old_dflash2 $BOLD $S/dflash2-b16 kprof ;;
      new_dflash2) bench new_dflash2 $B $S/dflash2-b16 kprof ;;
    esac
  done
fi
if want pair; then
  echo "== pair ($((SECONDS - T0)) s)"
  for i in $(seq ${REPEATS:-3}); do
    bench dflash_$i $B $DF
    bench dflash2_$i $B $S/dflash2-b16
    bench old_dflash2_$i $BOLD $S/dflash2-b16
    bench dflash2_generic_$i $B $S/dflash2-b16 - BLOCKSPEC_CONV_KERNEL=generic
  done
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "d2fast12 total $((SECONDS - T0)) s"
