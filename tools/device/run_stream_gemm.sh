#!/bin/bash
# Runs on the GPU machine from the repo root (issue 17, GemvMode::kStream): the stream GEMM's
# tests and timings. Binaries carried in $D (default build-cuda/stream10: blockspec,
# cuda_ops_test, cuda_models_test, lib/, source_dir.txt, as make_dist.sh lays them out).
#   times   - the per-matrix microbenchmark (cuda_ops_test StreamGemmTimesAtQwen3Shapes)
#   tests   - the matmul / stream GEMM / graph tests of cuda_ops_test, cuda_models_test's
#             speculative == plain tests
#   bench   - synthetic Qwen3-8B + DFlash-b16 (forced 100 %): bench --gemv stream --kernels
#             (stream with pinned cuBLASLt beside it), then --gemv auto for draft / end to end
# Logs under $OUT. Extra environment (BLOCKSPEC_STREAM_VARIANT, BLOCKSPEC_STREAM_MAX_MIB) passes
# through.
set -u
D=${D:-build-cuda/stream10}
export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
L=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
[ -n "$L" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$L")
SRC=$(cat $D/source_dir.txt 2>/dev/null)
[ -n "$SRC" ] && [ ! -e "$SRC" ] && mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"
B=$D/blockspec
T0=$SECONDS
ARGS="${*:-times tests bench}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/env.txt
if want times; then
  BLOCKSPEC_STREAM_TIMES=1 timeout 120 $D/cuda_ops_test --gtest_filter='*StreamGemmTimes*' > $OUT/times.txt 2>&1
  echo "== times rc=$? ($((SECONDS - T0))s)"; grep "^\[ " $OUT/times.txt
fi
# PICK=1: the variant for the step benchmarks is the one with the least per-token matmul time in
# "times", 1 row + 16 rows (else the backend's default or BLOCKSPEC_STREAM_VARIANT).
if [ -n "${PICK:-}" ] && [ -z "${BLOCKSPEC_STREAM_VARIANT:-}" ] && [ -s $OUT/times.txt ]; then
  export BLOCKSPEC_STREAM_VARIANT=$(grep -E "rows, stream v" $OUT/times.txt |
    sed -E 's/.*stream v([0-9]+):.*per token ([0-9.]+) ms.*/\1 \2/' |
    awk '{t[$1] += $2} END {best = -1; for (v in t) if (best < 0 || t[v] < t[best]) best = v; print best}')
  echo "== picked BLOCKSPEC_STREAM_VARIANT=$BLOCKSPEC_STREAM_VARIANT"
fi
if want tests; then
  # FILTER='*' runs the whole files (the small kernels' early trigger touches every forward).
  timeout 150 $D/cuda_ops_test --gtest_filter="${FILTER:-*StreamGemm*:*Matmul*:*Captured*:*RowCount*:*Prologue*:*Swiglu*:*Norms*:*PagedAttention*}" > $OUT/ops.txt 2>&1
  echo "== ops rc=$? ($((SECONDS - T0))s)"; grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|n=|rows=" $OUT/ops.txt | head -30
  timeout 150 $D/cuda_models_test --gtest_filter="${FILTER:-*Speculative*:*Greedy*}" > $OUT/models.txt 2>&1
  echo "== models rc=$? ($((SECONDS - T0))s)"; grep -E "^\[  (PASSED|FAILED) |Failure|Expected" $OUT/models.txt | head -20
fi
if want bench; then
  S=/dev/shm/synth
  timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > $OUT/synth.txt 2>&1
  echo "== synth rc=$? ($((SECONDS - T0))s)"
  M="--model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda --context 512"
  timeout 150 $B bench $M --iters ${ITERS:-20} --gen-tokens 256 --gemv stream ${KERNELS---kernels} > $OUT/bench_stream.txt 2>&1
  echo "== bench stream rc=$? ($((SECONDS - T0))s)"; grep -vE "^\s*$" $OUT/bench_stream.txt | grep -E "matmul|step|floor|generate|output|tok/s|error" | head -40
  # EXTRA="VAR=value ...": one more stream A/B under that environment (another variant or size cap).
  if [ -n "${EXTRA:-}" ] && [ $((SECONDS - T0)) -lt ${EXTRA_BEFORE:-200} ]; then
    env $EXTRA timeout 100 $B bench $M --iters ${ITERS:-20} --gen-tokens 256 --gemv stream > $OUT/bench_extra.txt 2>&1
    echo "== bench stream with $EXTRA rc=$? ($((SECONDS - T0))s)"; grep -E "step|generate|output|error" $OUT/bench_extra.txt | head -20
  fi
  if [ $((SECONDS - T0)) -lt ${AUTO_BEFORE:-230} ]; then
    timeout 100 $B bench $M --iters ${ITERS:-20} --gen-tokens 256 --gemv auto > $OUT/bench_auto.txt 2>&1
    echo "== bench auto rc=$? ($((SECONDS - T0))s)"; grep -E "step|floor|generate|output|tok/s|error" $OUT/bench_auto.txt | head -20
  fi
fi
echo "total $((SECONDS - T0))s"
