#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1): session 11's measuring call, ~8 minutes:
#   tests - the CUDA suites (run_session7.sh tests),
#   steps - synthetic Qwen3-8B (bf16): batch-1 DFlash-b16 and DFlash2-b16 decode / verify / draft
#           (output == plain), `bench --kernels --batch N` (N in ATTN_BATCHES, default 32) with the
#           default attention kernel and BLOCKSPEC_ATTN_KERNEL=v1,
#   serve - run_serve_s8.sh at 1 / 32 / 128 clients (128 -> 256 tokens), plain and DFlash-b16
#           forced 100 %, with bench's prefill-free and end-to-end denominators.
# STEPS=0 / SERVE=0 leave a section out; TESTS_S / SERVE_S bound them; RUNS / BENCH_BATCHES
# (run_serve_s8.sh's) narrow the serving matrix.
# Files into $OUT: session.txt, serve_summary.txt, logs.tgz.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session $OUT/session.txt
L=/tmp/s11; rm -rf $L; mkdir -p $L/tests $L/steps $L/serve
start_synth $L/steps/synth.txt
echo "== tests ($((SECONDS - T0)) s)"
[ "${TESTS:-1}" = 1 ] && OUT=$L/tests timeout -k 5 ${TESTS_S:-170} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA" | grep -v "^\[ "
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
STEP_LINES="step \(pinned|verify step \(16 rows, taps|draft step|^generate|output ==|error"
if [ "${STEPS:-1}" = 1 ]; then
  timeout 90 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 20 \
    --context 512 --gen-tokens 256 --gemv auto > $L/steps/bench_dflash.txt 2>&1
  echo "-- dflash-b16 rc=$? ($((SECONDS - T0)) s)"
  grep -E "$STEP_LINES" $L/steps/bench_dflash.txt
  timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
    --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt
  timeout 90 $B bench $M --drafter $S/dflash2-b16 --device cuda --iters 20 --context 512 \
    --gen-tokens 256 --gemv auto > $L/steps/bench_dflash2.txt 2>&1
  echo "-- dflash2-b16 rc=$? ($((SECONDS - T0)) s)"
  grep -E "$STEP_LINES" $L/steps/bench_dflash2.txt
  rm -rf $S/dflash2-b16
  for n in ${ATTN_BATCHES:-32}; do
    for v in default v1; do
      E=; [ $v = v1 ] && E=v1
      BLOCKSPEC_ATTN_KERNEL=$E timeout 90 $B bench $M --device cuda --iters 5 --warmup 2 --context 384 \
        --gen-tokens 32 --batch $n --prompt-tokens 128 --kernels > $L/steps/kb${n}_$v.txt 2>&1
      echo "-- batch $n attention $v rc=$? ($((SECONDS - T0)) s)"
      grep -E "^batch decode step|prologue\\+attention|step from its ops" $L/steps/kb${n}_$v.txt
    done
  done
fi
if [ "${SERVE:-1}" = 1 ]; then
  echo "== serve ($((SECONDS - T0)) s)"
  OUT=$L/serve BUDGET=${SERVE_S:-260} BENCH_BATCHES="${BENCH_BATCHES:-1 32 128}" \
    RUNS="${RUNS:-128:256:1:2 128:256:32:2 128:256:128:2}" \
    timeout -k 5 $((${SERVE_S:-260} + 40)) bash tools/device/run_serve_s8.sh 2>&1 | tail -n 14
  cp $L/serve/summary.txt $OUT/serve_summary.txt 2>/dev/null
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "session11 total $((SECONDS - T0)) s"
