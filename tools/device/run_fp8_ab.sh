#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking the dist (as run_session9b.sh):
# the FP8 drafter product's A/B (issue 17), ~3 minutes:
#   tests - cuda_ops_test's FP8 tests (v2, the default kernel, and v1, both in every test),
#   steps - synthetic Qwen3-8B + DFlash-b16 with a 32,768-token draft vocabulary and FP8 drafter
#           weights: `bench --kernels` (per-shape FP8 product times at 1 and 16 rows, draft step)
#           with the v2 kernel, then with BLOCKSPEC_FP8_KERNEL=v1, then v2 again (drift check).
# Files into $OUT: fp8_ab.txt, bench_fp8_*.txt.
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
timeout 240 $D/cuda_ops_test --gtest_filter='CudaOps.Fp8*' 2>&1 | grep -E "^\[|Failure|got|rows=|round" | head -60
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"; tail -2 /tmp/synth_dv.txt
for K in v2 v1 v2; do
  BLOCKSPEC_FP8_KERNEL=$K timeout 120 $B bench --model $S/qwen3-8b --drafter $S/dv32k --device cuda \
    --iters 20 --context 512 --gen-tokens 256 --drafter-fp8 --kernels > $OUT/bench_fp8_$K.txt.tmp 2>&1
  echo "-- BLOCKSPEC_FP8_KERNEL=$K rc=$? ($((SECONDS - T0)) s)"
  cat $OUT/bench_fp8_$K.txt.tmp >> $OUT/bench_fp8_$K.txt; rm -f $OUT/bench_fp8_$K.txt.tmp
  grep -E "kernels,|FP8 weights|step|generate|output ==|error" $OUT/bench_fp8_$K.txt | tail -n 12
done
