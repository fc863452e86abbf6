#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1): the split-KV attention's variants
# (issue 17's verify gap: 16-row attention 24.8 vs 9.4 us a layer). First the attention tests of
# cuda_ops_test (TESTS=0 skips them; TEST_FILTER replaces the gtest filter), then for each entry of
# VARIANTS (environment assignments joined by '+', "-" for none; default below), ROUNDS times
# (default 1), alternating (GEMV: the --gemv mode, default auto; e.g. GEMV=stream with
# VARIANTS="BLOCKSPEC_STREAM_VARIANT=4+BLOCKSPEC_STREAM_MAX_MIB=4096 ..." for the stream GEMMs):
#   blockspec bench --model qwen3-8b --drafter dflash-b16-acc100 --device cuda --iters 20
#     --context 512 --gen-tokens 256 --gemv auto --kernels      (decode / verify / draft / e2e,
#                                                                 attention at 1 and 16 rows)
#   blockspec bench --model qwen3-8b --device cuda --iters 5 --warmup 2 --context 384
#     --gen-tokens 32 --batch 32 --prompt-tokens 128 --kernels  (BATCH=0 skips it)
# Files into $OUT: attn_variants.txt, bench_<variant>_<round>.txt, batch_<variant>_<round>.txt.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session "$OUT/attn_variants.txt"
start_synth /tmp/synth.txt
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 $D/cuda_ops_test \
    --gtest_filter="${TEST_FILTER:-*SplitAttention*:*FusedPrologue*:*AttentionRows*:*PagedAttention*}" \
    > $OUT/attn_tests.txt 2>&1
  echo "-- attention tests rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED) |Failure" $OUT/attn_tests.txt | head -30
fi
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
VARIANTS=${VARIANTS:-"- BLOCKSPEC_ATTN_QPT=2 BLOCKSPEC_ATTN_KERNEL=v4 BLOCKSPEC_ATTN_KERNEL=v4+BLOCKSPEC_ATTN_MMA_TILE=16 BLOCKSPEC_ATTN_KERNEL=v4+BLOCKSPEC_ATTN_MMA_TILE=32"}
for round in $(seq 1 "${ROUNDS:-1}"); do
  for v in $VARIANTS; do
    tag=${v//[^A-Za-z0-9]/_}; e=${v//+/ }; [ "$v" = - ] && e= && tag=default
    f=$OUT/bench_${tag}_$round.txt
    env $e timeout 120 $B bench --model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 \
      --device cuda --iters 20 --context 512 --gen-tokens 256 --gemv "${GEMV:-auto}" --kernels > $f 2>&1
    echo "-- $v round $round rc=$? ($((SECONDS - T0)) s)"
    grep -E "small ops \(us\)|decode step \(|verify step \(|draft step|^generate \(spec|output ==|error" $f \
      | sed 's/host time.*output/... output/'
    if [ "${BATCH:-1}" = 1 ]; then
      f=$OUT/batch_${tag}_$round.txt
      env $e timeout 90 $B bench --model $S/qwen3-8b --device cuda --iters 5 --warmup 2 --context 384 \
        --gen-tokens 32 --batch 32 --prompt-tokens 128 --gemv "${GEMV:-auto}" --kernels > $f 2>&1
      echo "-- $v batch 32 rc=$? ($((SECONDS - T0)) s)"
      grep -E "small ops \(us\)|batch decode step|error" $f | head -4
    fi
  done
done
echo "total $((SECONDS - T0)) s"
