#!/bin/bash
# Runs on the GPU machine from the repo root: CUDA tests, then benches (stories260K, synthetic
# Qwen3-8B + DFlash-b16 at forced 100% and 0% acceptance). Logs under $OUT.
set -u
. tools/device/device_env.sh
{
  echo "repo: $PWD -> $(readlink -f /work/main)"; head -2 /etc/os-release
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  ldd $B | grep -E "not found|cublas|fmt"; df -h /tmp /dev/shm | tail -2; free -g | head -2
} 2>&1 | tee $OUT/env.txt
runtests() {  # one process per test, so that an abort loses one test only
  local bin=$1 log=$2
  : > $log
  for t in $($bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    timeout 120 $bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
  done
  echo "== $bin: $(grep -c '^\[       OK' $log) ok, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed, $(grep -c '^\[  SKIPPED \] [A-Z]' $log) skipped"
  grep -E "^!!!|Failure|Expected|Which is|actual|rel err|first diff|margin|acceptance length|Skipped" -A1 $log | grep -v "^--" | head -${3:-40}
}
{ runtests $D/cuda_ops_test $OUT/cuda_ops_test.txt 60
  runtests $D/cuda_models_test $OUT/cuda_models_test.txt 40
  runtests $D/bench_cli_test $OUT/bench_cli_test.txt 10; } | tee $OUT/tests_summary.txt
timeout 90 $B bench --model models/stories260K --device cuda --iters 30 --context 256 --gen-tokens 200 > $OUT/bench_stories260K.txt 2>&1; echo "stories bench rc=$?"; cat $OUT/bench_stories260K.txt
S=/tmp/synth; [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] && S=/dev/shm/synth
( time ( $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 &&
  $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 0 ) ) > $OUT/synth.txt 2>&1
echo "synth rc=$?"; tail -5 $OUT/synth.txt; ls -la $S/qwen3-8b | head -3
for acc in 100 0; do
  it=50; G=512; [ $acc = 0 ] && it=20 && G=256
  X=""; [ $acc = 100 ] && X="--kernels"; [ $acc = 0 ] && X="--gemv auto"; timeout 200 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc$acc --device cuda --iters $it --context 512 --gen-tokens $G $X > $OUT/bench_qwen3_8b_acc$acc.txt 2>&1
  echo "qwen3-8b acc$acc bench rc=$?"; cat $OUT/bench_qwen3_8b_acc$acc.txt
done
# The FlashMap-b16 synthetic drafter runs in its own call (tools/device/run_flashmap_bench.sh):
# its load takes long enough that both would not fit one device call.
# The forced-100% and forced-0% drafters with FP8 drafter weights (--drafter-fp8).
for acc in 100 0; do
  X=""; [ $acc = 100 ] && X="--kernels"  # with the FP8 product timed alone at the model's shapes
  timeout 200 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc$acc --device cuda --iters 30 --context 512 --gen-tokens 256 --drafter-fp8 $X > $OUT/bench_qwen3_8b_acc${acc}_fp8.txt 2>&1
  echo "qwen3-8b acc$acc fp8-drafter bench rc=$?"; grep -E "step|generate|FP8" $OUT/bench_qwen3_8b_acc${acc}_fp8.txt
done
# The same forced-100% bench without CUDA graphs (every op launched from the host).
BLOCKSPEC_CUDA_GRAPHS=0 timeout 200 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 30 --context 512 --gen-tokens 256 > $OUT/bench_qwen3_8b_acc100_nographs.txt 2>&1
echo "qwen3-8b acc100 no-graphs bench rc=$?"; cat $OUT/bench_qwen3_8b_acc100_nographs.txt
# Batches of 8 and 32 sequences: plain decoding (one weight stream per step), the batched verify
# step and batched speculative decoding with the forced-100% drafter.
for b in 8 32; do
  timeout 240 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 10 --context 512 --gen-tokens 64 --batch $b > $OUT/bench_qwen3_8b_batch$b.txt 2>&1
  echo "qwen3-8b batch $b bench rc=$?"; grep -E "batch|generate" $OUT/bench_qwen3_8b_batch$b.txt
done
# The shipped trained drafters on the GPU: acceptance and speed on the 32 held-out prompts.
for d in dflash flashmap; do
  $D/eval_acceptance --model models/stories260K --drafter models/stories260K-$d --prompts tools/train/eval_prompts.json --device cuda > $OUT/eval_$d.txt 2>&1
  echo "eval $d rc=$?"; cat $OUT/eval_$d.txt
done
$D/eval_acceptance --model models/stories260K --drafter models/stories260K-dflash --prompts tools/train/eval_prompts.json --device cuda --drafter-fp8 > $OUT/eval_dflash_fp8.txt 2>&1
echo "eval dflash fp8 rc=$?"; cat $OUT/eval_dflash_fp8.txt
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "== test summary (repeated)"; grep "^== " $OUT/tests_summary.txt
