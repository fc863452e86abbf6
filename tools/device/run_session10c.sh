#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1): session 10's last call, ~4.5 minutes:
#   tests - the CUDA suites (run_session7.sh tests), with the batched decode attention's tests,
#   steps - synthetic Qwen3-8B (bf16): `bench --kernels --batch N` with the attention kernel of
#           branch attn10 and with BLOCKSPEC_ATTN_KERNEL=v1 (N = 32, 128), and the batch-1
#           DFlash-b16 and DFlash2-b16 steps (decode / verify / draft, output == plain),
#   serve - run_serve_s8.sh at 32 clients, plain and DFlash-b16 forced 100 %, then plain with
#           BLOCKSPEC_OVERLAP=0 (overlapped plain steps off; SERVE=0: not;
#           STEPS=0 leaves the steps out).
# Files into $OUT: session.txt, serve_summary.txt, logs.tgz.
set -u
T0=$SECONDS
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine
L=/tmp/s10c; rm -rf $L; mkdir -p $L/tests $L/steps $L/serve
S=/dev/shm/synth
timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  > $L/steps/synth.txt 2>&1 &
SYNTH_PID=$!
echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 ${TESTS_S:-150} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA" | grep -v "^\[ "
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
if [ "${STEPS:-1}" = 1 ]; then
for n in ${ATTN_BATCHES:-32 128}; do
  for v in new v1; do
    E=; [ $v = v1 ] && E=v1
    BLOCKSPEC_ATTN_KERNEL=$E timeout 90 $B bench $M --device cuda --iters 5 --warmup 2 --context 384 \
      --gen-tokens 32 --batch $n --prompt-tokens 128 --kernels > $L/steps/kb${n}_$v.txt 2>&1
    echo "-- batch $n attention $v rc=$? ($((SECONDS - T0)) s)"
    grep -E "^batch decode step|prologue\\+attention|step from its ops|^generate" $L/steps/kb${n}_$v.txt
  done
done
timeout 90 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 20 --context 512 \
  --gen-tokens 256 --gemv auto > $L/steps/bench_dflash.txt 2>&1
echo "-- dflash-b16 rc=$? ($((SECONDS - T0)) s)"
grep -E "step \(pinned|verify step \(16 rows, taps|draft step|^generate \(spec|output ==|error" $L/steps/bench_dflash.txt
# DFlash2's draft step: its dynamic convolutions and soft-cap now launch with PDL (issue 14).
timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
  --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt
timeout 90 $B bench $M --drafter $S/dflash2-b16 --device cuda --iters 20 --context 512 \
  --gen-tokens 256 --gemv auto > $L/steps/bench_dflash2.txt 2>&1
echo "-- dflash2-b16 rc=$? ($((SECONDS - T0)) s)"
grep -E "step \(pinned|verify step \(16 rows, taps|draft step|^generate \(spec|output ==|error" $L/steps/bench_dflash2.txt
rm -rf $S/dflash2-b16
fi
if [ "${SERVE:-1}" = 1 ]; then
  # Overlapped plain steps (the default) and BLOCKSPEC_OVERLAP=0, the denominator measured once.
  echo "== serve, overlap on ($((SECONDS - T0)) s)"
  OUT=$L/serve BUDGET=${SERVE_ON_S:-170} BENCH_BATCHES=32 RUNS="128:256:32:2" \
    timeout -k 5 200 bash tools/device/run_serve_s8.sh 2>&1 | tail -n 12
  cp $L/serve/summary.txt $OUT/serve_summary.txt 2>/dev/null
  echo "== serve, overlap off ($((SECONDS - T0)) s)"
  mkdir -p $L/serve_off
  OUT=$L/serve_off BUDGET=${SERVE_OFF_S:-80} BENCH_BATCHES=" " BLOCKSPEC_OVERLAP=0 RUNS="128:256:32:2" \
    timeout -k 5 110 bash tools/device/run_serve_s8.sh 2>&1 | tail -n 8
  cp $L/serve_off/summary.txt $OUT/serve_off_summary.txt 2>/dev/null
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "session10c total $((SECONDS - T0)) s"
