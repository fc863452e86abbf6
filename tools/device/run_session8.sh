#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (pack_session8.sh made build-cuda/pack here): issue 18's three remaining checks, by
# section (default: all three):
#   fuzz      - tools/device/run_fuzz_long.sh in the background from the start: every libFuzzer
#               harness on all cores but 2 (the GPU sections use those), FUZZ_CAP seconds
#               (default TOTAL_S - 45), 10^7 executions each as the target
#   sanitizer - tools/device/run_compute_sanitizer.sh in the background: memcheck over all of
#               cuda_ops_test and a speculative generate, racecheck per test under a cap (5 min)
#   gpuload   - tools/device/run_gpu_load.sh alongside: the 256-client load driver against serve on
#               the GPU (stories260K, synthetic Qwen3-8B at 40,960 context, --preemption); a run
#               starts only before TOTAL_S - 160 s
# TOTAL_S (default 540) bounds the whole run. Into $OUT, at most 8 files: session8.txt (every
# section's summary), cuda_ops_memcheck.txt, cuda_ops_racecheck.txt, sanitizer_other.txt (the
# generate memcheck and the tool's version), gpuload_logs.txt, fuzz_summary.txt,
# fuzz_corpus.tar.xz.
set -u
T0=$SECONDS
TOTAL_S=${TOTAL_S:-540}
ARGS="${*:-sanitizer gpuload fuzz}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
LOG=$OUT/session8.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "$(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; sections: $ARGS; TOTAL_S $TOTAL_S"
FUZZ_PID=
if want fuzz; then
  OUT=$OUT bash tools/device/run_fuzz_long.sh "${FUZZ_CAP:-$((TOTAL_S - 45))}" "${FUZZ_TARGET:-10000000}" \
    > /tmp/fuzz_long.txt 2>&1 &
  FUZZ_PID=$!
  echo "== fuzz started in the background (pid $FUZZ_PID)"
fi
# The sanitizer and the load runs share the GPU and the 2 cores the fuzzers leave (the sanitizer
# in the background): sequential, they would take ~9 minutes together.
SAN_PID=
if want sanitizer; then
  # MemoryInfoFollowsAllocations measures the GPU's free memory, which the load runs' servers
  # change beside it: left out here (it allocates and frees one tensor, nothing to sanitize).
  OUT=/tmp/san SKIP_TESTS=CudaOps.MemoryInfoFollowsAllocations timeout -k 5 $((TOTAL_S - 30)) bash tools/device/run_compute_sanitizer.sh > /tmp/san.txt 2>&1 &
  SAN_PID=$!
  echo "== sanitizer started in the background (pid $SAN_PID)"
fi
if want gpuload; then
  budget=$((TOTAL_S - 60 - 100 - (SECONDS - T0)))  # the last run starts by then (~100 s each)
  ((budget < 0)) && budget=0
  echo "== gpuload ($((SECONDS - T0)) s, runs start within $budget s)"
  OUT=/tmp/gl BUDGET=$budget timeout -k 5 $((TOTAL_S - 30 - (SECONDS - T0))) bash tools/device/run_gpu_load.sh ||
    echo "gpuload: stopped at the TOTAL_S limit (rc=$?)"
  if [ -e /tmp/gl/gpuload_logs.txt ]; then
    cp /tmp/gl/gpuload_logs.txt $OUT/
  else  # stopped before it wrote them
    for f in /tmp/gpuload/driver_*.txt /tmp/gpuload/serve_*.txt; do echo "--- $f"; tail -n 15 "$f"; done > $OUT/gpuload_logs.txt 2>&1
  fi
fi
if [ -n "$SAN_PID" ]; then
  echo "== waiting for the sanitizer ($((SECONDS - T0)) s)"
  wait $SAN_PID
  cat /tmp/san.txt
  cp /tmp/san/cuda_ops_memcheck.txt /tmp/san/cuda_ops_racecheck.txt $OUT/ 2>/dev/null
  cat /tmp/san/env.txt /tmp/san/generate_memcheck.txt > $OUT/sanitizer_other.txt 2>/dev/null
fi
if [ -n "$FUZZ_PID" ]; then
  echo "== waiting for fuzz ($((SECONDS - T0)) s)"
  wait $FUZZ_PID
  cat /tmp/fuzz_long.txt
fi
echo "session8 total $((SECONDS - T0)) s"
