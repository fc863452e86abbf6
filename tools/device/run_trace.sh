#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1, which also builds build-cuda/pack/kprof):
# kernel timelines (tools/kprof with KPROF_TRACE) of forced-100 % speculative benches at Qwen3-8B
# shapes, one per drafter in TRACE_DRAFTERS (default "dflash-b16 dflash2-b16") and per entry of
# TRACE_ENVS (default "-": none; e.g. "- BLOCKSPEC_X=0"), and optionally first the tests that
# TEST_FILTER / MODELS_FILTER select in cuda_ops_test / cuda_models_test. Files into $OUT: session.txt,
# trace_<drafter>.txt.xz ("start_ns end_ns name" per kernel), kprof_<drafter>.txt.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session $OUT/session.txt
L=/tmp/trace; rm -rf $L; mkdir -p $L
start_synth $L/synth.txt
if [ -n "${TEST_FILTER:-}" ]; then
  timeout 120 $D/cuda_ops_test --gtest_filter="$TEST_FILTER" > $L/tests.txt 2>&1
  echo "-- cuda_ops_test $TEST_FILTER rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|  OK|PASSED) |Failure" $L/tests.txt | head -40
fi
if [ -n "${MODELS_FILTER:-}" ]; then
  timeout 200 $D/cuda_models_test --gtest_filter="$MODELS_FILTER" > $L/models.txt 2>&1
  echo "-- cuda_models_test $MODELS_FILTER rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|  OK|PASSED) |Failure" $L/models.txt | head -40
fi
if [ -n "${BENCHCLI:-}" ]; then
  mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"  # bench_cli_test runs it from there
  timeout 200 $D/bench_cli_test > $L/benchcli.txt 2>&1
  echo "-- bench_cli_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure" $L/benchcli.txt | head -20
fi
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
KP=build-cuda/pack/kprof
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
for d in ${TRACE_DRAFTERS:-dflash-b16 dflash2-b16}; do
  dir=$S/qwen3-8b-$d-acc100
  [ -e $dir ] || timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter $d \
    --acceptance 100 --drafter-out $dir > $L/synth_$d.txt 2>&1 || tail -3 $L/synth_$d.txt
  for e in ${TRACE_ENVS:--}; do
    tag=$d${e//[^A-Za-z0-9]/_}; [ "$e" = - ] && e= && tag=$d
    env $e CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$OUT/kprof_$tag.txt \
      KPROF_TRACE=$L/trace_$tag.txt timeout 90 $B bench --model $S/qwen3-8b --drafter $dir \
      --device cuda --iters 20 --context 512 --gen-tokens 64 --gemv auto > $L/bench_$tag.txt 2>&1
    echo "-- $tag rc=$? ($((SECONDS - T0)) s)"
    grep -E "verify step|draft step|^generate \(spec|output ==|error" $L/bench_$tag.txt
    xz -T0 -6 < $L/trace_$tag.txt > $OUT/trace_$tag.txt.xz
  done
done
echo "trace total $((SECONDS - T0)) s"
