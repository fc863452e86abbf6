#!/bin/bash
# Runs on the GPU machine from the repo root after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (carry ["build-cuda/pack/dist.tar.xz"]): session 23's call, v4 attention with
# 16-vector tiles as the default (issue 17's verify goal), in stages (STAGES, default all, in
# this order; a stage is skipped once SECONDS passes BUDGET_S, default 540):
#   attn   - run_attn_variants.sh: the default against BLOCKSPEC_ATTN_KERNEL=v3 (the old
#            default), ROUNDS (2) alternating rounds of the issue-17 bench and the batch-32 step;
#   models - cuda_models_test (greedy speculative == plain on the GPU, now under v4);
#   ops    - cuda_ops_test (every op test, the attention ones under the new default);
#   fp8    - run_fp8_ab.sh with KERNELS ("bulk v1") on the 32k-draft-vocabulary drafter.
# Everything that matters is printed; the sub-scripts' files land in $OUT and come back as
# $OUT/logs.tar.xz.
set -u
T0=$SECONDS
. tools/device/device_env.sh
print_machine
STAGES=${STAGES:-"attn models ops fp8"}
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
tar -C $LOGS -cf - . | xz -T4 > $OUT/logs.tar.xz
echo "total $((SECONDS - T0)) s"
