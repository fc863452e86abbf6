#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1; optionally dist/blockspec_old, a binary
# of the baseline commit): session 12's measuring calls. Sections (arguments, default all):
#   tests - the CUDA suites (run_session7.sh tests), bounded by TESTS_S,
#   steps - synthetic Qwen3-8B (bf16) + DFlash-b16 forced 100 %: batch-1 decode / verify / draft
#           with `--kernels` (each op alone at 1 and 16 rows); with STEP_ENVS (assignments, e.g.
#           "BLOCKSPEC_ATTN_KERNEL=v4 BLOCKSPEC_LT_REDUCTION=inplace") also the same bench (no
#           --kernels) under each,
#   families - DFlash2-b16 and DSpark-b7 forced 100 % (their draft steps, greedy draw included),
#           once per entry of FAMILY_ENVS (default "-": none; e.g. "- BLOCKSPEC_LT_REDUCTION=inplace"
#           runs each bench plain, then with that variable set; FAMILIES picks the drafters),
#   batch - `bench --kernels --batch N` (N in BATCHES, default 32; 128-token prompts, 384 cached
#           tokens), PAIRS times over VARIANTS (default "old new": blockspec_old when present,
#           blockspec; "v3" / "v4": blockspec under BLOCKSPEC_ATTN_KERNEL=v3 / v4),
#   prof  - the DFlash-b16 bench (decode, verify, draft) under tools/kprof (per-kernel GPU time;
#           build-cuda/pack/kprof from pack_session8.sh) once per kernel in PROF_KERNELS (default
#           "v3 v4"): where the verify step's time goes with each split pass,
#   serve - run_serve_s8.sh (SERVE_S, RUNS, BENCH_BATCHES as there).
# Files into $OUT: session.txt, logs.tgz.
set -u
T0=$SECONDS
ARGS="${*:-tests steps families batch prof serve}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
. tools/device/device_env.sh
start_session $OUT/session.txt
L=/tmp/s12; rm -rf $L; mkdir -p $L/tests $L/steps $L/serve
start_synth $L/steps/synth.txt
if want tests; then
  echo "== tests ($((SECONDS - T0)) s)"
  OUT=$L/tests timeout -k 5 ${TESTS_S:-170} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA" | grep -v "^\[ "
fi
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
if want steps; then
  timeout 120 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 20 \
    --context 512 --gen-tokens 256 --gemv auto --kernels > $L/steps/bench_dflash.txt 2>&1
  echo "-- dflash-b16 --kernels rc=$? ($((SECONDS - T0)) s)"
  grep -E "step \(pinned|verify step \(16 rows, taps|draft step|^generate|output ==|error|^kernels|matmuls per|small ops" $L/steps/bench_dflash.txt
  for e in ${STEP_ENVS:-}; do
    f=$L/steps/bench_dflash_${e//[^A-Za-z0-9]/_}.txt
    env $e timeout 90 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 \
      --device cuda --iters 20 --context 512 --gen-tokens 256 --gemv auto > $f 2>&1
    echo "-- dflash-b16 $e rc=$? ($((SECONDS - T0)) s)"
    grep -E "step \(pinned|verify step \(16 rows, taps|draft step|^generate \(spec|output ==|error" $f
  done
fi
if want families; then
  for d in ${FAMILIES:-dflash2-b16 dspark-b7}; do
    timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter $d --acceptance 100 \
      --drafter-out $S/$d > $L/steps/synth_$d.txt 2>&1 || tail -3 $L/steps/synth_$d.txt
    for e in ${FAMILY_ENVS:--}; do
      f=$L/steps/bench_${d}_${e//[^A-Za-z0-9]/_}.txt
      [ "$e" = - ] && e=
      env $e timeout 90 $B bench $M --drafter $S/$d --device cuda --iters 20 --context 512 \
        --gen-tokens 256 --gemv auto > $f 2>&1
      echo "-- $d ${e:-plain} rc=$? ($((SECONDS - T0)) s)"
      grep -E "verify step|draft step|context update|speculative step|^generate \(spec|output ==|error" $f
    done
    rm -rf $S/$d
  done
fi
if want batch; then
  for i in $(seq ${PAIRS:-2}); do
    for bin in ${VARIANTS:-old new}; do
      X=$B; [ $bin = old ] && X=$D/blockspec_old
      E=; case $bin in v[0-9]) E=$bin ;; esac
      [ -x $X ] || continue
      for n in ${BATCHES:-32}; do
        BLOCKSPEC_ATTN_KERNEL=$E timeout 90 $X bench $M --device cuda --iters 5 --warmup 2 \
          --context 384 --gen-tokens 32 --batch $n --prompt-tokens 128 --kernels \
          > $L/steps/kb${n}_${bin}_$i.txt 2>&1
        echo "-- batch $n $bin #$i rc=$? ($((SECONDS - T0)) s)"
        grep -E "^batch decode step|prologue\\+attention|step from its ops" $L/steps/kb${n}_${bin}_$i.txt
      done
    done
  done
fi
if want prof; then
  KP=build-cuda/pack/kprof
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP
  for k in ${PROF_KERNELS:-v3 v4}; do
    BLOCKSPEC_ATTN_KERNEL=$k CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$OUT/kprof_$k.txt \
      timeout 90 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --iters 20 \
      --context 512 --gen-tokens 32 --gemv auto > $L/steps/prof_$k.txt 2>&1
    echo "-- kprof attention $k rc=$? ($((SECONDS - T0)) s)"
    head -12 $OUT/kprof_$k.txt 2>/dev/null
  done
fi
if want serve; then
  echo "== serve ($((SECONDS - T0)) s)"
  OUT=$L/serve BUDGET=${SERVE_S:-260} BENCH_BATCHES="${BENCH_BATCHES:-1 32 128}" \
    RUNS="${RUNS:-128:256:1:2 128:256:32:2 128:256:128:2}" \
    timeout -k 5 $((${SERVE_S:-260} + 40)) bash tools/device/run_serve_s8.sh 2>&1 | tail -n 14
fi
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
echo "session12 total $((SECONDS - T0)) s"
