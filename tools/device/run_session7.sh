#!/bin/bash
# Runs on the GPU machine from the repo root (binaries carried in build-cuda/dist, make_dist.sh):
# the session-7 checks, by section (default: tests reliability):
#   tests       - cuda_ops_test, cuda_models_test, bench_cli_test, one process per test
#   reliability - tools/device/run_reliability_check.sh (issue 18)
#   relatives   - synthetic Qwen3-8B + DSpark-b7 / DFlash2-b16 / DFlash-b16 at forced 100 % and
#                 0 %: bench step times per drafter family (issue 14)
#   serve       - tools/device/run_prefill_serve.sh serve (bench-serve vs bench --batch, issue 15)
#   sanitizer   - tools/device/run_compute_sanitizer.sh (issue 18)
# Logs under $OUT.
set -u
. tools/device/device_env.sh
T0=$SECONDS
ARGS="${*:-tests reliability}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/env.txt
runtests() {  # one process per test, so that an abort loses one test only
  local bin=$1 log=$2
  : > $log
  for t in $($bin --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    timeout 150 $bin --gtest_filter="$t" >> $log 2>&1 || echo "!!! $t rc=$?" >> $log
  done
  echo "== $bin: $(grep -c '^\[       OK' $log) ok, $(grep -c '^\[  FAILED  \] [A-Z]' $log) failed, $(grep -c '^\[  SKIPPED \] [A-Z]' $log) skipped ($((SECONDS - T0))s)"
  grep -E "^!!!|Failure|Expected|Which is|actual|rel err|first diff" -A1 $log | grep -v "^--" | head -30
}
if want tests || want benchcli; then
  # bench_cli_test runs the blockspec binary of its build folder (BS_BINARY_DIR): put it there.
  mkdir -p "$SRC/build" && cp $B "$SRC/build/blockspec"
  want tests && runtests $D/cuda_ops_test $OUT/cuda_ops_test.txt
  want tests && runtests $D/cuda_models_test $OUT/cuda_models_test.txt
  runtests $D/bench_cli_test $OUT/bench_cli_test.txt
fi
if want reliability; then
  # Its many logs stay on the machine (at most 8 files come back): the summary and start-up lines.
  OUT=/tmp/rel bash tools/device/run_reliability_check.sh > /tmp/rel.txt 2>&1
  echo "== reliability ($((SECONDS - T0))s)"; cat /tmp/rel/summary.txt
  { cat /tmp/rel.txt; tail -n 30 /tmp/rel/serve_*.txt; } > $OUT/reliability.txt
fi
S=/dev/shm/synth
if want relatives; then
  M="--model $S/qwen3-8b"
  for d in dflash-b16 dspark-b7 dflash2-b16; do
    for acc in ${ACCS:-100 0}; do
      timeout 120 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter $d --acceptance $acc > $OUT/synth_$d$acc.txt 2>&1 || { echo "synth $d $acc failed"; tail -3 $OUT/synth_$d$acc.txt; }
      timeout 150 $B bench $M --drafter $S/qwen3-8b-$d-acc$acc --device cuda --iters 20 --context 512 --gen-tokens 256 > $OUT/bench_${d}_acc$acc.txt 2>&1
      echo "-- $d acc$acc rc=$? ($((SECONDS - T0))s)"; grep -E "step|generate|output ==|error" $OUT/bench_${d}_acc$acc.txt
      rm -rf $S/qwen3-8b-$d-acc$acc
    done
  done
fi
if want serve; then BUDGET=400 bash tools/device/run_prefill_serve.sh serve 2>&1 | tee $OUT/serve.txt; fi
if want sanitizer; then bash tools/device/run_compute_sanitizer.sh 2>&1 | tee $OUT/sanitizer.txt; fi
echo "total $((SECONDS - T0))s"
