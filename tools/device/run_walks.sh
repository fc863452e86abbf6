#!/bin/bash
# Issue 14 (fused drafter walks, docs/DFLASH.md): runs on the GPU machine from the repo root with
# the binaries carried in build-cuda/dist (make_dist.sh). The CUDA tests of the walks (one process
# per test), then the draft step of each relative family at forced 100 % acceptance with this
# build and, when build-cuda/before/blockspec exists (a binary from before the change, carried
# along), with that binary on the same synthetic checkpoint. Logs under $OUT (at most 8 files
# come back from a device call: the tests' logs go into one file).
set -u
. tools/device/device_env.sh
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"
runtests() {  # bin filter log: one process per test, so that an abort loses one test only
  local bin=$1 filter=$2 log=$3
  for t in $($bin --gtest_list_tests --gtest_filter="$filter" | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    timeout 60 $bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
  done
  echo "== $bin: $(grep -c '^\[       OK' $log) ok in $log so far, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed ($((SECONDS - T0))s)"
  grep -E "^!!!|Failure|Expected|Which is|actual|rel err|acceptance" -A1 $log | grep -v "^--" | head -40
}
: > $OUT/tests.txt
runtests $D/cuda_ops_test "${OPS:-CudaOps.*Relative*:CudaOps.Topk*:CudaOps.MarkovRow*:CudaOps.CandidateWalk*:CudaOps.*Sampl*:CudaOps.*Captured*}" $OUT/tests.txt
runtests $D/cuda_models_test "${MODELS:-*CudaRelatives*:*CudaDrafters*}" $OUT/tests.txt
runtests $D/bench_cli_test "SynthRelatives.*" $OUT/tests.txt
S=/dev/shm/synth
M="--model $S/qwen3-8b"
for d in ${DRAFTERS:-dflash-b16 dspark-b7 dflash2-b16}; do
  timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter $d --acceptance 100 > /tmp/synth_$d.txt 2>&1 || { echo "synth $d failed"; tail -3 /tmp/synth_$d.txt; continue; }
  for which in after before; do
    bin=$B; [ $which = before ] && bin=build-cuda/before/blockspec
    [ -x $bin ] || continue
    timeout 120 $bin bench $M --drafter $S/qwen3-8b-$d-acc100 --device cuda --iters 20 --context 512 --gen-tokens 256 > $OUT/bench_${d}_$which.txt 2>&1
    echo "-- $d $which rc=$? ($((SECONDS - T0))s)"; grep -E "step|generate|output ==|error" $OUT/bench_${d}_$which.txt
  done
  rm -rf $S/qwen3-8b-$d-acc100
done
echo "total $((SECONDS - T0))s"
