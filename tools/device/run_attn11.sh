#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (FULL=1 bash tools/device/pack_session8.sh build build-fuzz): session 11, branch
# attn11, the batched decode attention (issue 17).
# (Session 11: BLOCKSPEC_ATTN_COMBINE, the warp combine it selected, was removed from main after
# this call; the script is the record of what ran at branch attn11.)
#   MODE=profile - the split-KV tests (v3 == v1 bit for bit), then `bench --kernels --batch 32`
#                  with the split kernel v1 and v3 and v3's microbenchmark switches
#                  (BLOCKSPEC_ATTN_DIAG: 1 no K/V loads, 2 no arithmetic, 4 no combine pass;
#                  the op's time without each part), --batch 128 v1 / v3, and the batch-1
#                  DFlash-b16 decode / verify / draft steps v1 / v3;
#   MODE=final   - cuda_ops_test's attention tests, then, in order of value: --batch 32 v3 vs v1,
#                  the batch-1 steps v3 vs v1, cuda_models_test's batched / speculative == plain
#                  tests, --batch 128 v3 vs v1, --batch 32 v3 with the block combine, the batch-1
#                  steps again (v3 = split v3 + warp combine, v1 = split v1 + block combine).
# Files into $OUT: session.txt and the logs.
set -u
T0=$SECONDS
. tools/device/device_env.sh
start_session $OUT/session.txt
L=$OUT/logs; mkdir -p $L
start_synth $L/synth.txt
if [ "${MODE:-profile}" = profile ]; then
  echo "== split-KV tests ($((SECONDS - T0)) s)"
  timeout 90 $D/cuda_ops_test --gtest_filter='CudaOps.SplitAttention*:CudaOps.FusedPrologueSplit*:CudaOps.*Prologue*' \
    > $L/split_tests.txt 2>&1
  echo "split tests rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED|     OK) |Failure|kernel v" $L/split_tests.txt | head -20
else
  # The attention tests of cuda_ops_test (the whole suites need more device time than this call).
  echo "== attention tests ($((SECONDS - T0)) s)"
  timeout 40 $D/cuda_ops_test --gtest_filter='CudaOps.Split*:CudaOps.FusedPrologue*:CudaOps.PagedAttentionBatch*:CudaOps.AttentionRows*' > $L/attention_tests.txt 2>&1
  echo "attention tests rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED|     OK) |Failure|combine|kernel v" $L/attention_tests.txt | head -40
fi
wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
# Kernel settings (as run in session 11's final call): v3 = split v3 + warp combine, v1 = split
# v1 + block combine (session 10's main), v3b = split v3 + block combine (the default chosen
# afterwards); the diag bits as above.
env_of() {
  case $1 in
    v1) echo "BLOCKSPEC_ATTN_KERNEL=v1 BLOCKSPEC_ATTN_COMBINE=v1" ;;
    v3b) echo "BLOCKSPEC_ATTN_KERNEL=v3 BLOCKSPEC_ATTN_COMBINE=v1" ;;
    *) echo "BLOCKSPEC_ATTN_KERNEL=v3 BLOCKSPEC_ATTN_COMBINE=v2" ;;
  esac
}
kb() {  # batch, setting, diag bits
  env $(env_of $2) BLOCKSPEC_ATTN_DIAG=$3 timeout 60 $B bench $M --device cuda --iters ${ITERS:-3} \
    --warmup 1 --context 384 --gen-tokens ${GEN:-4} --batch $1 --prompt-tokens 128 --kernels \
    > $L/kb$1_$2_d$3.txt 2>&1
  echo "-- batch $1 attention $2 diag $3 rc=$? ($((SECONDS - T0)) s)"
  grep -E "^batch decode step|small ops \(us\)|step from its ops" $L/kb$1_$2_d$3.txt |
    sed -E 's/.*(prologue\+attention \(fused, as the decoder\) [0-9.]+;).*(unfused: attention \(batched\) [0-9.]+;).*/  \1 \2/'
}
b1() {  # setting, repeat
  env $(env_of $1) timeout 90 $B bench $M --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda \
    --iters 20 --context 512 --gen-tokens ${B1_GEN:-64} --gemv auto > $L/b1_$1_$2.txt 2>&1
  echo "-- batch 1 dflash-b16 attention $1 rc=$? ($((SECONDS - T0)) s)"
  grep -E "step \(pinned|verify step \(16 rows, taps|draft step|output ==|error" $L/b1_$1_$2.txt
}
if [ "${MODE:-profile}" = profile ]; then
  for cfg in v1:0 v3:0 v1:4 v3:4 v3:1 v3:2 v3:3; do kb 32 ${cfg%:*} ${cfg#*:}; done
  for k in v1 v3; do kb 128 $k 0; done
  for k in v1 v3; do b1 $k 1; done
else
  # In order of value, so that a call cut short still has the main figures.
  for k in v3 v1; do kb 32 $k 0; done
  for k in v3 v1; do b1 $k 1; done
  echo "== models subset ($((SECONDS - T0)) s)"
  timeout ${MODELS_S:-30} $D/cuda_models_test --gtest_filter='*Batched*:*SpeculativeEqualsPlain*' \
    > $L/models_subset.txt 2>&1
  echo "models subset rc=$? ($((SECONDS - T0)) s)"
  grep -E "^\[  (FAILED|PASSED|     OK) |Failure" $L/models_subset.txt | head -12
  for k in v3 v1; do kb 128 $k 0; done
  kb 32 v3b 0
  for k in v3 v1; do b1 $k 2; done
fi
echo "attn11 total $((SECONDS - T0)) s"
