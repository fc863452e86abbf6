#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (FULL=1 bash tools/device/pack_session8.sh build -; carry ["build-cuda/pack"]):
# the bulk-copy stream GEMMs (stream_gemm.h variants 4-9) and their fused RMSNorm / SwiGLU forms
# (issue 17), in one call of about 6 minutes:
#   0. a smoke test of the bulk kernels (90 s at most; their benches are skipped if it fails);
#   1. their tests: cuda_ops_test's stream GEMM / FP8 / matmul / attention tests, cuda_models_test's
#      greedy speculative == plain with each stream variant and the drafter families, then
#      compute-sanitizer memcheck over the bulk kernels' bit tests;
#   2. the per-matrix microbenchmark of every variant against pinned cuBLASLt
#      (StreamGemmTimesAtQwen3Shapes: Qwen3-8B shapes, 1 and 16 rows);
#   3. whole steps, synthetic Qwen3-8B + forced-100 % DFlash-b16 (bench --kernels), under each
#      entry of VARIANTS (environment assignments joined by '+'; GEMV=stream for all but "auto").
# STAGES="tests times bench" picks stages. Files into $OUT: stream_bulk.txt (the summary), the
# test logs, times.txt, bench_<variant>.txt.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session "$OUT/stream_bulk.txt"
STAGES=${STAGES:-"tests times bench"}
want() { [[ " $STAGES " == *" $1 "* ]]; }
want bench && start_synth /tmp/synth.txt
# First a smoke test of the bulk kernels alone (their waits trap instead of hanging, so a broken
# pipeline fails in seconds); if it fails, the bulk variants' benches are skipped.
BULK_OK=1
timeout 90 $D/cuda_ops_test --gtest_filter='*StreamBulkVariantsEqual*:*Fp8BulkKernelGivesV1Bits*' \
  > $OUT/bulk_smoke.txt 2>&1
rc=$?; echo "-- bulk smoke rc=$rc ($((SECONDS - T0)) s)"
grep -E "^\[  (FAILED|PASSED) |Failure|error|variant" $OUT/bulk_smoke.txt | head -12
[ $rc = 0 ] || BULK_OK=0
if want tests; then
  timeout 200 $D/cuda_ops_test \
    --gtest_filter='*Stream*:*Fp8*:*Matmul*:*RowCount*:*Captured*:*Swiglu*:*Norms*:*SplitAttention*:*PagedAttention*' \
    > $OUT/ops_tests.txt 2>&1
  echo "-- cuda_ops_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|variant" $OUT/ops_tests.txt | head -30
  timeout 200 $D/cuda_models_test --gtest_filter='*StreamGemm*:*Relatives*:*Drafters*' \
    > $OUT/models_tests.txt 2>&1
  echo "-- cuda_models_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|variant" $OUT/models_tests.txt | head -20
  # compute-sanitizer memcheck over the bulk kernels' bit tests (SANITIZE=0: not); rc 0 when clean.
  if [ "${SANITIZE:-1}" = 1 ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 150 "$CS" --tool memcheck --error-exitcode 99 $D/cuda_ops_test \
      --gtest_filter='*StreamBulkVariantsEqual*:*Fp8BulkKernelGivesV1Bits*' > $OUT/bulk_memcheck.txt 2>&1
    echo "-- memcheck rc=$? ($((SECONDS - T0)) s)"
    grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" $OUT/bulk_memcheck.txt
  fi
fi
if want times; then
  BLOCKSPEC_STREAM_TIMES=1 timeout 180 $D/cuda_ops_test --gtest_filter='*StreamGemmTimes*' \
    > $OUT/times.txt 2>&1
  echo "-- times rc=$? ($((SECONDS - T0)) s)"
  grep "^\[ " $OUT/times.txt
  # The bulk variants with x resident at every row count (BLOCKSPEC_STREAM_RESIDENT_ROWS=1).
  BLOCKSPEC_STREAM_RESIDENT_ROWS=1 BLOCKSPEC_STREAM_TIMES=1 timeout 150 $D/cuda_ops_test \
    --gtest_filter='*StreamGemmTimes*' > $OUT/times_resident.txt 2>&1
  echo "-- times, x resident from 1 row: rc=$? ($((SECONDS - T0)) s)"
  grep "stream v[4-9]" $OUT/times_resident.txt
fi
if want bench; then
  wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
  ALL=BLOCKSPEC_STREAM_MAX_MIB=4096
  V5=BLOCKSPEC_STREAM_VARIANT=5+$ALL V7=BLOCKSPEC_STREAM_VARIANT=7+$ALL
  V8=BLOCKSPEC_STREAM_VARIANT=8+$ALL NOFUSE=BLOCKSPEC_STREAM_FUSE=0
  V9=BLOCKSPEC_STREAM_VARIANT=9+$ALL
  VARIANTS=${VARIANTS:-"auto $V5+$NOFUSE $V8+$NOFUSE $V9+$NOFUSE $V9"}
  for v in $VARIANTS; do
    if [ $BULK_OK = 0 ] && [[ "$v" == *VARIANT=[4-9]* ]]; then echo "-- $v skipped"; continue; fi
    tag=${v//[^A-Za-z0-9]/_}; e=${v//+/ }; gemv=stream
    [ "$v" = - ] && e= && tag=stream_default
    [ "$v" = auto ] && e= && gemv=auto
    f=$OUT/bench_$tag.txt
    env $e timeout 100 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 \
      --device cuda --iters 20 --context 512 --gen-tokens 256 --gemv $gemv --kernels > $f 2>&1
    echo "-- $v (--gemv $gemv) rc=$? ($((SECONDS - T0)) s)"
    grep -E "decode step \(|verify step \(|draft step|^generate \(spec|output ==|norm / swiglu|error" $f \
      | sed 's/host time.*output/... output/'
  done
fi
echo "total $((SECONDS - T0)) s"
