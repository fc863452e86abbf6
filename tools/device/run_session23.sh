#!/bin/bash
# Runs on the GPU machine from the repo root after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (carry ["build-cuda/pack/dist.tar.xz"]): session 23's call, v4 attention with
# 16-vector tiles as the default (issue 17's verify goal), in stages (STAGES, default all, in
# this order; a stage is skipped once SECONDS passes BUDGET_S, default 540):
#   attn   - run_attn_variants.sh: the default against BLOCKSPEC_ATTN_KERNEL=v3 (the old
#            default), ROUNDS (2) alternating rounds of the issue-17 bench and the batch-32 step;
#   models - cuda_models_test (greedy speculative == plain on the GPU, now under v4);
#   ops    - cuda_ops_test (every op test, the attention ones under the new default);
#   fp8    - run_fp8_ab.sh with KERNELS ("bulk v1") on the 32k-draft-vocabulary drafter;
#   table  - issue 17's table once under the defaults: the bench of run_attn_variants.sh and the
#            batch-32 step;
#   x16    - (named after its first use, the since-removed BLOCKSPEC_FP8_X16 A/B) the FP8 drafter
#            (32k draft vocabulary) under each of FP8_ENVS (environment assignments joined by '+';
#            default: BLOCKSPEC_FP8_KERNEL=v1 and =bulk), ROUNDS rounds, alternating;
#   gtests - cuda_ops_test with OPS_FILTER and cuda_models_test with MODELS_FILTER (gtest filters);
#   kprof  - that bench under tools/kprof with KPROF_TRACE (carry build-cuda/pack/kprof too),
#            read by tools/kprof/trace_bursts.py: each step kind's wall and per-kernel advance.
# Everything that matters is printed; the sub-scripts' files land in $OUT and come back as
# $OUT/logs.tar.xz.
set -u
T0=$SECONDS
. tools/device/device_env.sh
print_machine
STAGES=${STAGES:-"attn models ops fp8"}  # table x16 kprof: name them
BUDGET_S=${BUDGET_S:-540}
want() {
  [[ " $STAGES " == *" $1 "* ]] || return 1
  ((SECONDS - T0 < BUDGET_S)) || { echo "-- $1 skipped: $((SECONDS - T0)) s used"; return 1; }
}
LOGS=$OUT/logs && mkdir -p $LOGS
if want attn; then
  OUT=$LOGS VARIANTS=${ATTN_VARIANTS:-"- BLOCKSPEC_ATTN_KERNEL=v3"} ROUNDS=${ROUNDS:-2} TESTS=0 \
    bash tools/device/run_attn_variants.sh > /dev/null 2>&1
  cat $LOGS/attn_variants.txt
fi
if want models; then
  timeout 200 $D/cuda_models_test > $LOGS/models.txt 2>&1
  echo "-- cuda_models_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $LOGS/models.txt | head -20
fi
if want ops; then
  timeout 240 $D/cuda_ops_test > $LOGS/ops.txt 2>&1
  echo "-- cuda_ops_test rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $LOGS/ops.txt | head -20
fi
if want fp8; then
  OUT=$LOGS KERNELS=${KERNELS:-"bulk v1"} DRAFTERS=${DRAFTERS:-dv32k} SANITIZE=${SANITIZE:-0} \
    bash tools/device/run_fp8_ab.sh > /dev/null 2>&1
  grep -vE "^\[ RUN|^\[       OK" $LOGS/fp8_ab.txt | tail -40
fi
BENCH=(bench --model $S/qwen3-8b --device cuda --iters 20 --context 512 --gen-tokens 256
  --gemv auto)
synth_all() {  # the target, the bf16 drafter and the 32k-draft-vocabulary one
  start_synth /tmp/synth.txt
  wait $SYNTH_PID
  [ -e $S/dv32k/config.json ] || timeout 100 $B synth --preset qwen3-8b --out $S/qwen3-8b \
    --drafter dflash-b16 --acceptance 100 --draft-vocab 32768 --drafter-out $S/dv32k \
    > /tmp/synth_dv.txt 2>&1
  echo "synth ($((SECONDS - T0)) s)"
}
SHOW="copy bandwidth|decode step \(|verify step \(|draft step|^generate \(spec|output ==|error"
if want table; then
  synth_all
  timeout 120 $B "${BENCH[@]}" --drafter $S/qwen3-8b-dflash-b16-acc100 --kernels \
    > $LOGS/table.txt 2>&1
  echo "-- table rc=$? ($((SECONDS - T0)) s)"
  grep -E "small ops|$SHOW" $LOGS/table.txt | sed 's/host time.*output/... output/'
  timeout 90 $B bench --model $S/qwen3-8b --device cuda --iters 5 --warmup 2 --context 384 \
    --gen-tokens 32 --batch 32 --prompt-tokens 128 --kernels > $LOGS/table_batch32.txt 2>&1
  echo "-- batch 32 rc=$? ($((SECONDS - T0)) s)"
  grep -E "small ops|batch decode step|error" $LOGS/table_batch32.txt | head -4
fi
if want x16; then
  synth_all
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for v in ${FP8_ENVS:-BLOCKSPEC_FP8_KERNEL=v1 BLOCKSPEC_FP8_KERNEL=bulk}; do
      f=$LOGS/fp8_${v//[^A-Za-z0-9]/_}_$round.txt
      env ${v//+/ } timeout 100 $B "${BENCH[@]}" --drafter $S/dv32k --drafter-fp8 \
        --kernels > $f 2>&1
      echo "-- round $round $v rc=$? ($((SECONDS - T0)) s)"
      grep -E "FP8 weights\]|$SHOW" $f | sed 's/host time.*output/... output/' | grep -v "decode step (\(skinny\|SIMT\|stream\|cuBLASLt h\)"
    done
  done
fi
if want gtests; then
  timeout 200 $D/cuda_ops_test --gtest_filter="${OPS_FILTER:-*}" > $LOGS/ops_filtered.txt 2>&1
  echo "-- cuda_ops_test ${OPS_FILTER:-*} rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" $LOGS/ops_filtered.txt | head -20
  timeout 200 $D/cuda_models_test --gtest_filter="${MODELS_FILTER:-*}" > $LOGS/models_filtered.txt 2>&1
  echo "-- cuda_models_test ${MODELS_FILTER:-*} rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure|tests ran|fp8 dflash" $LOGS/models_filtered.txt | head -20
fi
KP=$PWD/build-cuda/pack/kprof
if want kprof && [ -e $KP/kprof.so ]; then
  synth_all
  LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$KP CUDA_INJECTION64_PATH=$KP/kprof.so KPROF_OUT=$LOGS/kprof.txt \
    KPROF_TRACE=/tmp/trace.txt KPROF_TRACE_MAX=3000000 timeout 150 $B "${BENCH[@]}" \
    --drafter $S/dv32k --drafter-fp8 > $LOGS/kprof_bench.txt 2>&1
  echo "-- kprof rc=$? ($((SECONDS - T0)) s)"
  grep -E "$SHOW" $LOGS/kprof_bench.txt | sed 's/host time.*//'
  xz -T4 -c /tmp/trace.txt > $LOGS/trace.txt.xz
  python3 tools/kprof/trace_bursts.py /tmp/trace.txt --detail 0 --gap-us 6 | head -20
  # The step kinds with at least 20 replays, the first four, in detail.
  for k in $(python3 tools/kprof/trace_bursts.py /tmp/trace.txt --gap-us 6 --detail 0 | awk 'NR>2 && $2>=20 {print $1}' | head -4); do
    python3 tools/kprof/trace_bursts.py /tmp/trace.txt --gap-us 6 --kind $k --detail 24 | sed -n '/^step with/,$p'
  done
fi
tar -C $LOGS -cf - . | xz -T4 > $OUT/logs.tar.xz
echo "total $((SECONDS - T0)) s"
