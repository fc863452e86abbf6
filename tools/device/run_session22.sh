#!/bin/bash
# Runs on the GPU machine from the repo root after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (carry ["build-cuda/pack/dist.tar.xz", "build-cuda/pack/kprof"]): session 22's
# issue-17 table and a timeline of the verify step, in one call of about 7 minutes:
#   1. whole steps (synthetic Qwen3-8B + forced-100 % DFlash-b16, bench --kernels) under each
#      entry of VARIANTS (as run_stream_bulk.sh: environment assignments joined by '+');
#   2. the batch-32 plain decode step (bench --batch 32);
#   3. the same benches without --kernels under tools/kprof with KPROF_TRACE, each read by
#      tools/kprof/trace_bursts.py (per step kind: wall, busy and summed kernel time; per kernel
#      name: its share of the verify step's wall time);
#   4. cuda_models_test's greedy speculative == plain tests.
# STAGES="bench batch kprof tests" picks stages; VARIANTS and KPROF_VARIANTS the benches'.
# Files into $OUT: session22.txt (everything that matters is printed there), bench_*.txt,
# traces.tar (the kprof summaries and xz'd timelines).
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session "$OUT/session22.txt"
start_synth /tmp/synth.txt
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
ALL=BLOCKSPEC_STREAM_MAX_MIB=4096 NOFUSE=BLOCKSPEC_STREAM_FUSE=0
V5=BLOCKSPEC_STREAM_VARIANT=5+$ALL+$NOFUSE V8=BLOCKSPEC_STREAM_VARIANT=8+$ALL+$NOFUSE
V9=BLOCKSPEC_STREAM_VARIANT=9+$ALL+$NOFUSE V9F=BLOCKSPEC_STREAM_VARIANT=9+$ALL
VARIANTS=${VARIANTS:-"auto $V5 $V8 $V9 $V9F"}
KPROF_VARIANTS=${KPROF_VARIANTS:-"auto $V8 $V9"}
STAGES=${STAGES:-"bench batch kprof tests"}
want() { [[ " $STAGES " == *" $1 "* ]]; }
BENCH=(bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 20
  --context 512 --gen-tokens 256)
run_variant() {  # variant: sets e (its environment), gemv and tag
  local v=$1
  tag=${v//[^A-Za-z0-9]/_}; e=${v//+/ }; gemv=stream
  [ "$v" = auto ] && e= && gemv=auto
}
want bench && for v in $VARIANTS; do
  run_variant $v
  f=$OUT/bench_$tag.txt
  env $e timeout 120 $B "${BENCH[@]}" --gemv $gemv --kernels > $f 2>&1
  echo "-- $v (--gemv $gemv) rc=$? ($((SECONDS - T0)) s)"
  grep -E "copy bandwidth|decode step \(|verify step \(|draft step|^generate \(spec|output ==|error" $f \
    | sed 's/host time.*output/... output/'
done
if want batch; then
  timeout 120 $B bench --model $S/qwen3-8b --device cuda --iters 5 --warmup 2 --context 384 \
    --gen-tokens 32 --batch 32 --prompt-tokens 128 > $OUT/bench_batch32.txt 2>&1
  echo "-- batch 32 rc=$? ($((SECONDS - T0)) s)"
  grep -E "decode step|batch|error" $OUT/bench_batch32.txt | head -8
fi
KP=$PWD/build-cuda/pack/kprof
if want kprof && [ -e $KP/kprof.so ]; then
  for v in $KPROF_VARIANTS; do
    run_variant $v
    env $e LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP CUDA_INJECTION64_PATH=$KP/kprof.so \
      KPROF_OUT=/tmp/kprof_$tag.txt KPROF_TRACE=/tmp/trace_$tag.txt KPROF_TRACE_MAX=3000000 \
      timeout 150 $B "${BENCH[@]}" --gemv $gemv > /tmp/kbench_$tag.txt 2>&1
    echo "-- kprof $v rc=$? ($((SECONDS - T0)) s)"
    grep -E "decode step \(|verify step \(" /tmp/kbench_$tag.txt | sed 's/host time.*//'
    xz -T4 -c /tmp/trace_$tag.txt > /tmp/traces_$tag.xz
    python3 tools/kprof/trace_bursts.py /tmp/trace_$tag.txt --detail 0 --gap-us 6
    # The verify step: the most frequent burst whose kernel count is the largest of the
    # decode/verify pair (verify has the taps); printed for the two most common kinds.
    for k in $(python3 tools/kprof/trace_bursts.py /tmp/trace_$tag.txt --gap-us 6 --detail 0 | awk 'NR>2 && $2>=20 {print $1}' | head -3); do
      python3 tools/kprof/trace_bursts.py /tmp/trace_$tag.txt --gap-us 6 --kind $k --detail 14 | sed -n '/^step with/,$p'
    done
  done
  tar -C /tmp -cf $OUT/traces.tar $(cd /tmp && ls traces_*.xz kprof_*.txt)
fi
if want tests; then
  timeout 200 $D/cuda_models_test --gtest_filter='*StreamGemm*:*Relatives*:*Drafters*' \
    > $OUT/models_tests.txt 2>&1
  echo "-- cuda_models_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure" $OUT/models_tests.txt | head -10
fi
echo "total $((SECONDS - T0)) s"
