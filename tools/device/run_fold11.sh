#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking the dist of
# FULL=1 bash tools/device/pack_session8.sh build build-fuzz into build-cuda/: session 11, branch
# fold11, the split-KV combine folded into the split pass (issue 17).
#   cuda_ops_test's attention / split / prologue tests (the folded combine == the combine
#   launch bit for bit; FoldedCombineSplitAttention... was named FoldedCombineEquals... in the
#   measured call, which this filter missed: it ran only in the next step), then the folded test
#   (filter *FoldedCombine*) with the counter reset
#   switched off (BLOCKSPEC_ATTN_DIAG=8: must fail), then `bench --kernels --batch 32` and the
#   batch-1 DFlash-b16 decode / verify / draft steps, folded (BLOCKSPEC_ATTN_COMBINE=fold) vs
#   the two launches (=launch).
# Files into $OUT: session.txt and the logs.
set -u
T0=$SECONDS
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
L=$OUT/logs; mkdir -p $L
S=/dev/shm/s
timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  > $L/synth.txt 2>&1 &
SYNTH_PID=$!
echo "== attention tests ($((SECONDS - T0)) s)"
timeout ${TESTS_S:-75} $D/cuda_ops_test --gtest_filter='*Attention*:*Split*:*Prologue*' \
  > $L/attention_tests.txt 2>&1
echo "attention tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (FAILED|PASSED|     OK) |Failure|folded|kernel v" $L/attention_tests.txt | head -40
echo "== the folded test without the counter reset (must fail) ($((SECONDS - T0)) s)"
BLOCKSPEC_ATTN_DIAG=8 timeout 15 $D/cuda_ops_test --gtest_filter='*FoldedCombine*' \
  > $L/no_reset_test.txt 2>&1
echo "no-reset test rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (FAILED|PASSED|     OK) |folded call|run_captured" $L/no_reset_test.txt | head -6
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
kb() {  # combine (fold / launch)
  BLOCKSPEC_ATTN_COMBINE=$1 timeout 40 $B bench $M --device cuda --iters 5 --warmup 2 \
    --context 384 --gen-tokens 32 --batch 32 --prompt-tokens 128 --kernels > $L/kb32_$1.txt 2>&1
  echo "-- batch 32 combine $1 rc=$? ($((SECONDS - T0)) s)"
  grep -E "^batch decode step|small ops \(us\)|step from its ops" $L/kb32_$1.txt |
    sed -E 's/.*(prologue\+attention \(fused, as the decoder\) [0-9.]+;).*(unfused: attention \(batched\) [0-9.]+;).*/  \1 \2/'
}
b1() {  # combine
  BLOCKSPEC_ATTN_COMBINE=$1 timeout 45 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 \
    --device cuda --iters 20 --context 512 --gen-tokens 64 --gemv auto > $L/b1_$1.txt 2>&1
  echo "-- batch 1 dflash-b16 combine $1 rc=$? ($((SECONDS - T0)) s)"
  grep -E "step \(pinned|verify step \(16 rows, taps|draft step|output ==|error" $L/b1_$1.txt
}
for c in fold launch; do kb $c; done
for c in fold launch; do b1 $c; done
echo "fold11 total $((SECONDS - T0)) s"
