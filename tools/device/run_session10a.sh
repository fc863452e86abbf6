#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1): session 10's first call, ~6 minutes:
#   tests   - the CUDA suites (run_session7.sh tests), which check the batched-prefill read counts,
#   steps   - synthetic Qwen3-8B (bf16): DFlash-b16 and DFlash2-b16 draft steps, and with nsys (when
#             the image has it) the per-kernel time of both benches (issue 14's DFlash2 overhead),
#   serve   - plain serving at 32 clients (issue 15's step gap): host profile, and with nsys a
#             window of the server's kernels against `bench --batch 32`'s.
# Files into $OUT: session.txt, nsys_*.csv, logs.tgz.
set -u
T0=$SECONDS
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
L=/tmp/s10a; rm -rf $L; mkdir -p $L/tests $L/steps
S=/dev/shm/synth
timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  > $L/steps/synth_dflash.txt 2>&1 &
SYNTH_PID=$!
echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 ${TESTS_S:-150} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA"
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
BENCH="--device cuda --iters 20 --context 512 --gen-tokens 256"
timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
  --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt
for d in dflash-b16:$S/qwen3-8b-dflash-b16-acc100 dflash2-b16:$S/dflash2-b16; do
  name=${d%%:*}; dir=${d#*:}
  timeout 90 $B bench $M --drafter $dir $BENCH > $L/steps/bench_$name.txt 2>&1
  echo "-- $name rc=$? ($((SECONDS - T0)) s)"; grep -E "step|generate|output ==|error" $L/steps/bench_$name.txt
  if [ -n "$NSYS" ]; then
    timeout 120 $NSYS profile -t cuda --cuda-graph-trace=node -o $L/steps/nsys_$name -f true \
      $B bench $M --drafter $dir --device cuda --iters 10 --context 512 --gen-tokens 64 > $L/steps/nsys_$name.txt 2>&1
    timeout 60 $NSYS stats -q -r cuda_gpu_kern_sum -f csv -o $L/steps/k_$name $L/steps/nsys_$name.nsys-rep > /dev/null 2>&1
    cp $L/steps/k_${name}*.csv $OUT/ 2>/dev/null; ls $L/steps | grep "k_$name" || tail -5 $L/steps/nsys_$name.txt
  fi
done
echo "== serve ($((SECONDS - T0)) s)"
timeout 60 $B bench $M --device cuda --iters 3 --warmup 1 --context 384 --gen-tokens 256 --batch 32 \
  > $L/bench_b32.txt 2>&1; grep -E "^generate|step|error" $L/bench_b32.txt
PORT=18200
run_serve() {  # tag, prefix command...
  local tag=$1; shift
  PORT=$((PORT + 1))
  BLOCKSPEC_PROFILE_HOST=1 "$@" $B serve $M --no-drafter --device cuda --port $PORT \
    --max-num-seqs 128 --max-model-len 8448 > $L/serve_$tag.log 2>&1 &
  local pid=$!
  for _ in $(seq 120); do timeout 30 $B bench-serve --port $PORT --wait 1 --clients 1 --requests 1 --output-tokens 8 > /dev/null 2>&1 && break; sleep 1; done
  timeout 30 $B bench-serve --port $PORT --clients 32 --requests 32 --output-tokens 32 > /dev/null 2>&1
  for i in 1 2; do
    timeout 40 $B bench-serve --port $PORT --clients 32 --requests 64 --prompt-tokens 128 \
      --output-tokens 256 --seed 1 --timeout 30 > $L/bs_${tag}_$i.txt 2>&1
    echo "-- serve $tag run $i rc=$? ($((SECONDS - T0)) s)"; grep -iE "output tok|tpot|ttft" $L/bs_${tag}_$i.txt | head -4
  done
  kill $pid 2>/dev/null; for _ in $(seq 30); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done; kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  grep -iE "profile|step|prefill|admission" $L/serve_$tag.log | tail -8
}
run_serve plain
if [ -n "$NSYS" ]; then
  # Kernels of a window of the 32-client run: the server starts collecting at --delay.
  run_serve nsys timeout 150 $NSYS profile -t cuda,osrt --cuda-graph-trace=node --delay 25 --duration 6 \
    -o $L/nsys_serve -f true
  sleep 3
  timeout 60 $NSYS stats -q -r cuda_gpu_kern_sum -f csv -o $L/k_serve $L/nsys_serve.nsys-rep > /dev/null 2>&1
  timeout 60 $NSYS profile -t cuda --cuda-graph-trace=node -o $L/nsys_b32 -f true \
    $B bench $M --device cuda --iters 2 --warmup 1 --context 384 --gen-tokens 128 --batch 32 > /dev/null 2>&1
  timeout 60 $NSYS stats -q -r cuda_gpu_kern_sum -f csv -o $L/k_b32 $L/nsys_b32.nsys-rep > /dev/null 2>&1
  cp $L/k_*.csv $OUT/ 2>/dev/null
fi
rm -f $L/*.nsys-rep $L/steps/*.nsys-rep $L/*.sqlite $L/steps/*.sqlite
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
ls -la $OUT; echo "session10a total $((SECONDS - T0)) s"
