#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking the dist (as run_session9b.sh):
# the FP8 drafter product's A/B (issue 17):
#   tests - cuda_ops_test's FP8 tests (v2, the default kernel, and v1, both in every test),
#   steps - synthetic Qwen3-8B + DFlash-b16 with a 32,768-token draft vocabulary and FP8 drafter
#           weights: `bench --kernels` (per-shape FP8 product times at 1 and 16 rows, draft step)
#           with BLOCKSPEC_FP8_KERNEL=v2, then v1 (the default).
# Then compute-sanitizer memcheck / racecheck over the FP8 tests (SANITIZE=0: not). At most ~8.5 minutes (timeouts).
# Files into $OUT: fp8_ab.txt, bench_fp8_v1.txt, bench_fp8_v2.txt, fp8_memcheck.txt, fp8_racecheck.txt.
set -u
T0=$SECONDS
exec > >(tee -a "$OUT/fp8_ab.txt") 2>&1
. tools/device/device_env.sh
print_machine
S=/dev/shm/synth
timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  --draft-vocab 32768 --drafter-out $S/dv32k > /tmp/synth_dv.txt 2>&1 &
SYNTH_PID=$!
echo "== tests ($((SECONDS - T0)) s)"
timeout 150 $D/cuda_ops_test --gtest_filter='CudaOps.Fp8*' 2>&1 | grep -E "^\[|Failure|got|rows=|round" | head -60
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"; tail -2 /tmp/synth_dv.txt
for K in v2 v1; do
  BLOCKSPEC_FP8_KERNEL=$K timeout 100 $B bench --model $S/qwen3-8b --drafter $S/dv32k --device cuda \
    --iters 20 --context 512 --gen-tokens 256 --drafter-fp8 --kernels > $OUT/bench_fp8_$K.txt.tmp 2>&1
  echo "-- BLOCKSPEC_FP8_KERNEL=$K rc=$? ($((SECONDS - T0)) s)"
  cat $OUT/bench_fp8_$K.txt.tmp >> $OUT/bench_fp8_$K.txt; rm -f $OUT/bench_fp8_$K.txt.tmp
  grep -E "kernels,|FP8 weights|step|generate|output ==|error" $OUT/bench_fp8_$K.txt | tail -n 12
done
# compute-sanitizer over the FP8 kernels (SANITIZE=0 leaves it out): memcheck over the graph
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
