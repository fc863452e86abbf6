#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1; build-cuda/pack/kprof carried too):
# session 10's measuring call, ~9.5 minutes:
#   tests   - the CUDA suites (run_session7.sh tests), including the stream GEMM and FP8 tests,
#   steps   - synthetic Qwen3-8B (bf16), DFlash-b16 forced 100 %: decode / verify / draft with the
#             default matmuls (the small kernels now trigger their dependents early); the draft
#             step with a 32,768-token draft vocabulary and FP8 weights, FP8 kernel v2 against v1,
#             with --kernels (issue 17),
#   kprof   - (after serve, when time is left) per-kernel GPU time of the DFlash-b16 and DFlash2-b16 benches (issue 14) and of a
#             window of plain serving at 32 clients (issue 15),
#   serve   - tools/device/run_serve_s8.sh: bench --batch N (prompts as long as bench-serve's)
#             and bench-serve against serve, plain and DFlash-b16 (issue 15).
# STEPS=0 / KPROF=0 / SERVE=0 leave a section out. TOTAL_S (default 560) bounds the run.
# Files into $OUT: session.txt, serve_summary.txt, kprof_*.txt, logs.tgz.
set -u
T0=$SECONDS
TOTAL_S=${TOTAL_S:-560}
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine; echo "TOTAL_S $TOTAL_S"
L=/tmp/s10b; rm -rf $L; mkdir -p $L/tests $L/steps $L/serve $L/kprof
S=/dev/shm/synth
KP=$PWD/build-cuda/pack/kprof
[ -e $KP/kprof.so ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
kprof() {  # name, command...: the command under kprof, its summary into $OUT
  local name=$1; shift
  [ -e $KP/kprof.so ] || { "$@"; return; }
  CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$L/kprof/$name.txt "$@"
  cp $L/kprof/$name.txt $OUT/kprof_$name.txt 2>/dev/null
}
timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  > $L/steps/synth_dflash.txt 2>&1 &
SYNTH_PID=$!
echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 ${TESTS_S:-150} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA"
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
DF=$S/qwen3-8b-dflash-b16-acc100
BENCH="--device cuda --iters 20 --context 512 --gen-tokens 256"
step() {  # name, drafter dir, extra flags (env via the caller)
  local name=$1 dir=$2; shift 2
  timeout 90 $B bench $M --drafter $dir $BENCH "$@" > $L/steps/bench_$name.txt 2>&1
  echo "-- $name rc=$? ($((SECONDS - T0)) s)"
  grep -E "step \(pinned|step \(stream|verify step \(16 rows, taps|draft step|^generate|output ==|error" $L/steps/bench_$name.txt
}
if [ "${STEPS:-1}" = 1 ]; then
  echo "== steps ($((SECONDS - T0)) s)"
  step dflash-b16 $DF --gemv auto
  timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
    --draft-vocab 32768 --drafter-out $S/dv32k > $L/steps/synth_dv.txt 2>&1 || tail -3 $L/steps/synth_dv.txt
  for v in v2 v1; do
    BLOCKSPEC_FP8_KERNEL=$v timeout 90 $B bench $M --drafter $S/dv32k $BENCH --gemv auto --drafter-fp8 \
      --kernels > $L/steps/bench_dv32k_fp8_$v.txt 2>&1
    echo "-- dv32k fp8 $v rc=$? ($((SECONDS - T0)) s)"
    grep -E "matmul \[FP8|step \(pinned|verify step \(16 rows, taps|draft step|^generate \(spec|output ==|error" $L/steps/bench_dv32k_fp8_$v.txt
  done
  rm -rf $S/dv32k
fi
if [ "${SERVE:-1}" = 1 ]; then
  left=$((TOTAL_S - ${KPROF_S:-110} - (SECONDS - T0)))
  echo "== serve ($((SECONDS - T0)) s, budget $((left - 25)) s)"
  OUT=$L/serve BUDGET=$((left - 25)) BENCH_BATCHES=${BENCH_BATCHES:-"1 8 32 128"} \
    RUNS=${RUNS:-"128:256:1:2 128:256:8:2 128:256:32:2 128:256:128:2"} \
    timeout -k 5 $left bash tools/device/run_serve_s8.sh 2>&1 | tail -n 40
  cp $L/serve/summary.txt $OUT/serve_summary.txt 2>/dev/null
fi
if [ "${KPROF:-1}" = 1 ] && [ $((SECONDS - T0)) -lt $((TOTAL_S - 100)) ]; then
  echo "== kprof ($((SECONDS - T0)) s)"
  timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash2-b16 --acceptance 100 \
    --drafter-out $S/dflash2-b16 > $L/steps/synth_d2.txt 2>&1 || tail -3 $L/steps/synth_d2.txt
  for d in dflash-b16:$DF dflash2-b16:$S/dflash2-b16; do
    name=${d%%:*}; dir=${d#*:}
    kprof $name timeout 90 $B bench $M --drafter $dir --device cuda --iters 10 --context 512 \
      --gen-tokens 64 > $L/kprof/bench_$name.txt 2>&1
    echo "-- kprof $name rc=$? ($((SECONDS - T0)) s)"; head -3 $L/kprof/$name.txt 2>/dev/null
  done
  rm -rf $S/dflash2-b16
  # A window of plain serving at 32 clients: the GPU's busy share and its kernels per step.
  PORT=18300
  CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_WINDOW=signal KPROF_OUT=$L/kprof/serve_plain32.txt \
    BLOCKSPEC_PROFILE_HOST=1 $B serve $M --no-drafter --device cuda --port $PORT --max-num-seqs 128 \
    --max-model-len 8448 > $L/kprof/serve.log 2>&1 &
  SPID=$!
  for _ in $(seq 120); do timeout 30 $B bench-serve --port $PORT --wait 1 --clients 1 --requests 1 --output-tokens 8 > /dev/null 2>&1 && break; sleep 1; done
  timeout 30 $B bench-serve --port $PORT --clients 32 --requests 32 --output-tokens 32 > /dev/null 2>&1
  timeout 40 $B bench-serve --port $PORT --clients 32 --requests 64 --prompt-tokens 128 \
    --output-tokens 256 --seed 1 --timeout 30 > $L/kprof/bs_warm.txt 2>&1 &
  BPID=$!
  sleep 3; kill -USR1 $SPID; sleep 2; kill -USR2 $SPID
  wait $BPID; grep -iE "output tok|decode" $L/kprof/bs_warm.txt | head -3
  kill $SPID; for _ in $(seq 30); do kill -0 $SPID 2>/dev/null || break; sleep 0.5; done; kill -9 $SPID 2>/dev/null
  cp $L/kprof/serve_plain32.txt $OUT/kprof_serve_plain32.txt 2>/dev/null
  head -3 $L/kprof/serve_plain32.txt 2>/dev/null; grep "host profile" $L/kprof/serve.log | tail -2
  kprof bench_b32 timeout 60 $B bench $M --device cuda --iters 3 --warmup 1 --context 384 \
    --gen-tokens 256 --batch 32 --prompt-tokens 128 > $L/kprof/bench_b32.txt 2>&1
  grep -E "^generate|batch decode" $L/kprof/bench_b32.txt; head -3 $L/kprof/bench_b32.txt
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
ls -la $OUT; echo "session10b total $((SECONDS - T0)) s"
