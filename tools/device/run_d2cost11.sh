#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1; build-cuda/pack/kprof carried too):
# session 11, branch d2cost11 (issue 14: DFlash2's own cost in a speculative step). Sections:
#   prof  - synthetic Qwen3-8B (bf16) with DFlash-b16 and DFlash2-b16 forced 100 %: `bench
#           --gemv auto` of each under tools/kprof (per-kernel GPU time; the draft step's share is
#           launches / (warmup + iters) of the drafter's kernels),
#   tests - the CUDA suites (run_session7.sh tests; TESTS_FILTER=regex keeps only those tests),
#   pair  - REPEATS (3) alternating DFlash-b16 / DFlash2-b16 benches: draft, verify, speculative
#           step (KPROF2=1: then one more DFlash2 bench under kprof).
#   bash tools/device/run_d2cost11.sh prof|tests|pair ...
# Files into $OUT: session.txt, kprof_*.txt, logs.tgz.
set -u
T0=$SECONDS
ARGS="${*:-prof}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
L=/tmp/d2c; rm -rf $L; mkdir -p $L/tests $L/steps $L/kprof
S=/dev/shm/synth
KP=$PWD/build-cuda/pack/kprof
[ -e $KP/kprof.so ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
kprof() {  # name, command...: the command under kprof, its summary into $OUT
  local name=$1; shift
  [ -e $KP/kprof.so ] || { echo "no kprof.so"; "$@"; return; }
  CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$L/kprof/$name.txt "$@"
  cp $L/kprof/$name.txt $OUT/kprof_$name.txt 2>/dev/null
}
if want prof || want pair; then
  (timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
    > $L/steps/synth.txt 2>&1 || tail -3 $L/steps/synth.txt
   timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
    --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt) &
  SYNTH_PID=$!
fi
if want tests; then
  echo "== tests ($((SECONDS - T0)) s)"
  if [ -n "${TESTS_FILTER:-}" ]; then
    mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"
    for bin in cuda_ops_test cuda_models_test; do
      log=$OUT/$bin.txt; : > $log
      for t in $($D/$bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | grep -E "$TESTS_FILTER"); do
        timeout 100 $D/$bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
      done
      echo "== $bin: $(grep -c '^\[       OK' $log) ok, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed, $(grep -c '^\[  SKIPPED \] [A-Z]' $log) skipped ($((SECONDS - T0)) s)"
      grep -E "^!!!|Failure|Expected|Which is" -A1 $log | head -20
    done
  else
    OUT=$L/tests timeout -k 5 ${TESTS_S:-150} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA" | grep -v "^\[ "
    cp $L/tests/*.txt $OUT/ 2>/dev/null
  fi
fi
if want prof || want pair; then
  wait $SYNTH_PID; echo "synth done ($((SECONDS - T0)) s)"
fi
M="--model $S/qwen3-8b"
DF=$S/qwen3-8b-dflash-b16-acc100
bench() {  # name drafter_dir [kprof]
  local cmd=(timeout 90 $B bench $M --drafter $2 --device cuda --iters ${ITERS:-20} --context 512
    --gen-tokens ${GEN:-64} --gemv auto)
  if [ "${3:-}" = kprof ]; then kprof $1 "${cmd[@]}" > $L/steps/bench_$1.txt 2>&1
  else "${cmd[@]}" > $L/steps/bench_$1.txt 2>&1; fi
  echo "-- $1 rc=$? ($((SECONDS - T0)) s)"
  grep -E "verify step \(16 rows, taps|draft step|context update|speculative step|^generate \(spec|output ==|error" $L/steps/bench_$1.txt
}
if want prof; then
  echo "== prof ($((SECONDS - T0)) s)"
  bench dflash $DF kprof
  bench dflash2 $S/dflash2-b16 kprof
fi
if want pair; then
  echo "== pair ($((SECONDS - T0)) s)"
  for i in $(seq ${REPEATS:-3}); do
    bench dflash_$i $DF
    bench dflash2_$i $S/dflash2-b16
  done
  [ "${KPROF2:-0}" = 1 ] && bench dflash2_after $S/dflash2-b16 kprof
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "d2cost11 total $((SECONDS - T0)) s"
