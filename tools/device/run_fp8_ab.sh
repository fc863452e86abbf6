#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking the dist (as run_session9b.sh):
# the FP8 drafter product's A/B (issue 17):
#   tests - cuda_ops_test's FP8 tests (CudaOps.Fp8*, every kernel), and the tests TEST_EXTRA
#           selects (a gtest filter) in cuda_ops_test / MODELS_FILTER in cuda_models_test;
#   steps - synthetic Qwen3-8B + forced-100 % DFlash-b16 drafters with FP8 drafter weights, for
#           each of DRAFTERS (default: dv32k, a 32,768-token draft vocabulary, and full, the whole
#           vocabulary): `bench --drafter-fp8 --kernels` (per-shape FP8 product times, draft step,
#           end to end) with BLOCKSPEC_FP8_KERNEL = each of KERNELS (default "v1 v2"), alternating,
#           ROUNDS times (default 1).
# Then compute-sanitizer memcheck / racecheck over the FP8 tests (SANITIZE=0: not). At most ~8.5
# minutes (timeouts). Files into $OUT: fp8_ab.txt, bench_fp8_<drafter>_<kernel>.txt,
# fp8_memcheck.txt, fp8_racecheck.txt.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session "$OUT/fp8_ab.txt"
start_synth /tmp/synth.txt
echo "== tests ($((SECONDS - T0)) s)"
timeout 150 $D/cuda_ops_test --gtest_filter="CudaOps.Fp8*${TEST_EXTRA:+:$TEST_EXTRA}" > /tmp/ops.txt 2>&1
echo "-- cuda_ops_test rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (FAILED|  OK|PASSED) |Failure|got|rows=|round" /tmp/ops.txt | head -60
if [ -n "${MODELS_FILTER:-}" ]; then
  timeout 200 $D/cuda_models_test --gtest_filter="$MODELS_FILTER" > /tmp/models.txt 2>&1
  echo "-- cuda_models_test $MODELS_FILTER rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|  OK|PASSED) |Failure" /tmp/models.txt | head -40
fi
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"; tail -2 /tmp/synth.txt
[ -e $S/dv32k/config.json ] || timeout 100 $B synth --preset qwen3-8b --out $S/qwen3-8b \
  --drafter dflash-b16 --acceptance 100 --draft-vocab 32768 --drafter-out $S/dv32k > /tmp/synth_dv.txt 2>&1
for round in $(seq 1 "${ROUNDS:-1}"); do
  for d in ${DRAFTERS:-dv32k full}; do
    dir=$S/$d; [ "$d" = full ] && dir=$S/qwen3-8b-dflash-b16-acc100
    for K in ${KERNELS:-v1 v2}; do
      f=$OUT/bench_fp8_${d}_$K.txt
      BLOCKSPEC_FP8_KERNEL=$K timeout 100 $B bench --model $S/qwen3-8b --drafter $dir --device cuda \
        --iters 20 --context 512 --gen-tokens 256 --drafter-fp8 --kernels > $f.tmp 2>&1
      echo "-- round $round $d BLOCKSPEC_FP8_KERNEL=$K rc=$? ($((SECONDS - T0)) s)"
      cat $f.tmp >> $f; rm -f $f.tmp
      grep -E "kernels,|FP8|step|generate|output ==|error" $f | tail -n 14
    done
  done
done
# compute-sanitizer over the FP8 products (SANITIZE=0 leaves it out): memcheck over the graph
# replay and row-count tests, racecheck (shared memory) over the replay test; rc=0 when clean.
if [ "${SANITIZE:-1}" = 1 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 100 "$CS" --tool memcheck --error-exitcode 99 $D/cuda_ops_test \
    --gtest_filter='CudaOps.Fp8KernelsReplay*:CudaOps.Fp8KernelsRows*' > $OUT/fp8_memcheck.txt 2>&1
  echo "-- memcheck rc=$? ($((SECONDS - T0)) s)"; grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" $OUT/fp8_memcheck.txt
  timeout 60 "$CS" --tool racecheck --error-exitcode 99 $D/cuda_ops_test \
    --gtest_filter='CudaOps.Fp8KernelsReplay*' > $OUT/fp8_racecheck.txt 2>&1
  echo "-- racecheck rc=$? ($((SECONDS - T0)) s)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)" $OUT/fp8_racecheck.txt
fi
echo "total $((SECONDS - T0)) s"
