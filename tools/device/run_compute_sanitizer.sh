#!/bin/bash
# Runs on the GPU machine from the repo root (docs/RELIABILITY.md, "compute-sanitizer on GPU"):
# compute-sanitizer memcheck (with leak check) and racecheck over cuda_ops_test, then memcheck over
# one speculative `blockspec generate --device cuda` with stories260K and its DFlash drafter.
# Binaries: the carried build-cuda/dist (docs/CUDA.md) when present, else build/ (a build made on
# the machine). GTEST_FILTER narrows the test list when the whole binary is too slow under racecheck.
# Logs under $OUT; each line "<what> rc=N" is 0 when clean (--error-exitcode 99 on findings).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
if [ -d build-cuda/dist ]; then
  . tools/device/device_env.sh
  T=$D/cuda_ops_test
else
  B=build/blockspec
  T=build/tests/cuda_ops_test
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$CS" --version | tail -1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/env.txt"
filter=${GTEST_FILTER:-*}
# racecheck is much slower than memcheck: by default it covers the kernels that share memory
# between threads (attention, flash prefill, sampling, norms, top-k).
race_filter=${RACECHECK_FILTER:-*Attention*:*Prefill*:*Sampl*:*Draw*:*Norm*:*Relative*:*Argmax*}
timeout ${MEMCHECK_S:-200} "$CS" --tool memcheck --leak-check full --error-exitcode 99 \
  "$T" --gtest_filter="$filter" > "$OUT/cuda_ops_memcheck.txt" 2>&1
echo "cuda_ops_test memcheck rc=$?"
tail -4 "$OUT/cuda_ops_memcheck.txt"
timeout ${RACECHECK_S:-200} "$CS" --tool racecheck --racecheck-report all --error-exitcode 99 \
  "$T" --gtest_filter="$race_filter" > "$OUT/cuda_ops_racecheck.txt" 2>&1
echo "cuda_ops_test racecheck rc=$?"
tail -4 "$OUT/cuda_ops_racecheck.txt"
timeout ${GENERATE_S:-90} "$CS" --tool memcheck --leak-check full --error-exitcode 99 \
  "$B" generate --model models/stories260K --drafter models/stories260K-dflash --device cuda \
  --prompt "Tom had a red" --max-tokens 48 --temperature 0 > "$OUT/generate_memcheck.txt" 2>&1
echo "generate --device cuda (DFlash) memcheck rc=$?"
tail -4 "$OUT/generate_memcheck.txt"
