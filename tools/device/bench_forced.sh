#!/bin/bash
# Re-measures plain and forced-acceptance speculative decoding at Qwen3-8B shapes.
set -u
D=build-cuda/dist
export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
[ -n "$L" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$L")
B=$D/blockspec
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
S=/dev/shm/synth
$B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > $OUT/synth.txt 2>&1; echo "synth rc=$?"
timeout 240 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 50 --context 512 --gen-tokens 512 > $OUT/bench_acc100.txt 2>&1
echo "bench rc=$?"; cat $OUT/bench_acc100.txt
