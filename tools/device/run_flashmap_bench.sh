#!/bin/bash
# Runs on the GPU machine from the repo root: the synthetic Qwen3-8B target with the FlashMap-b16
# drafter (seed 000's shape, 500M) at forced 100% and 0% acceptance. Logs under $OUT.
set -u
. tools/device/device_env.sh
S=/tmp/synth; [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] && S=/dev/shm/synth
$B synth --preset qwen3-8b --out $S/qwen3-8b > $OUT/synth_target.txt 2>&1; echo "synth target rc=$?"
# The FlashMap drafter of seed 000's shape (flashmap-b16, 500M) at forced 100% and 0%, same flags
# (the target above is reused). Its load eigendecomposes the 4096x4096 embedding Gram on one host
# core (the one-jump noise fold); "load:" in the log says how long.
( time ( $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter flashmap-b16 --acceptance 100 &&
  $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter flashmap-b16 --acceptance 0 ) ) > $OUT/synth_flashmap.txt 2>&1
echo "synth flashmap rc=$?"; tail -5 $OUT/synth_flashmap.txt
for acc in 100 0; do
  it=50; G=512; [ $acc = 0 ] && it=20 && G=256
  X=""; [ $acc = 100 ] && X="--kernels"; [ $acc = 0 ] && X="--gemv auto"; timeout 280 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-flashmap-b16-acc$acc --device cuda --iters $it --context 512 --gen-tokens $G $X > $OUT/bench_qwen3_8b_flashmap_acc$acc.txt 2>&1
  echo "qwen3-8b flashmap acc$acc bench rc=$?"; cat $OUT/bench_qwen3_8b_flashmap_acc$acc.txt
done
