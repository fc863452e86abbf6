#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1 made build-cuda/pack here): session 9's
# verification call, sharing one machine's ~9 minutes between
#   fuzz      - tools/device/run_fuzz_long.sh in the background on FUZZ_CORES cores, weighted to
#               the harnesses furthest from 10^7 executions since their fixes (issue 18),
#   tests     - the CUDA suites (run_session7.sh tests: cuda_ops_test, cuda_models_test,
#               bench_cli_test, one process per test),
#   accept    - bench/eval_acceptance --device cuda, the four shipped stories260K drafters at T = 0
#               and T = 1 on the 32 held-out prompts (each asserts speculative == plain at T = 0),
#   racecheck - compute-sanitizer racecheck over every cuda_ops_test test, RACE_P processes at a
#               time beside the acceptance runs (issue 18).
# TOTAL_S (default 540) bounds the run. Files into $OUT: session.txt, fuzz_summary.txt,
# fuzz_corpus.tar.xz, racecheck.txt, logs.tgz.
set -u
T0=$SECONDS
TOTAL_S=${TOTAL_S:-540}
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine; echo "TOTAL_S $TOTAL_S"
L=/tmp/s9; rm -rf $L; mkdir -p $L/fuzz $L/tests $L/accept $L/race

OUT=$L/fuzz CORES=${FUZZ_CORES:-12} WEIGHTS=${FUZZ_WEIGHTS:-"hf_config:1 tokenizer_json:3 tokenizer_encode:3 jinja_template:6 chat_render:2 openai_request:2"} \
  bash tools/device/run_fuzz_long.sh "$((TOTAL_S - 45))" "${FUZZ_TARGET:-10000000}" > $L/fuzz.txt 2>&1 &
FUZZ_PID=$!
echo "== fuzz ($FUZZ_PID) started"

echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 ${TESTS_S:-300} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA"

# racecheck, one process per test, RACE_P at a time, until the run's end.
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
race_one() {  # test -> $L/race/<test>.txt, one summary line
  local t=$1 left=$((TOTAL_S - 30 - ($(date +%s) - START)))
  ((left < 10)) && { echo "$t not-run"; return; }
  ((left > ${RACE_TEST_S:-240})) && left=${RACE_TEST_S:-240}
  timeout $left "$CS" --tool racecheck --racecheck-report all --error-exitcode 99 --print-limit 20 \
    $D/cuda_ops_test --gtest_filter="$t" > $L/race/$t.txt 2>&1
  local r=$? v
  case $r in 0) v=clean ;; 124) v=timeout ;; *) v="HAZARD-OR-FAILURE rc=$r" ;; esac
  echo "$t $v $(grep -m1 -oE 'RACECHECK SUMMARY: [0-9]+ hazard' $L/race/$t.txt)"
}
START=$(($(date +%s) - (SECONDS - T0)))  # the run's start in epoch seconds (xargs' shells)
export -f race_one; export L START TOTAL_S CS D RACE_TEST_S
tests=$($D/cuda_ops_test --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
# The slowest under the tool (a sampling statistics test) first, so that it has the most time.
order=$( (echo "$tests" | grep DeviceDraws; echo "$tests" | grep -v DeviceDraws) )
echo "== racecheck ($((SECONDS - T0)) s): $(echo "$order" | wc -l) tests, ${RACE_P:-6} at a time"
(echo "$order" | xargs -P ${RACE_P:-6} -I{} bash -c 'race_one {}' > $L/racecheck_summary.txt 2>&1) &
RACE_PID=$!

echo "== acceptance ($((SECONDS - T0)) s): eval_acceptance --device cuda, 32 prompts x 192 tokens"
for d in dflash flashmap dspark dflash2; do
  for temp in 0 1; do
    f=$L/accept/${d}_T$temp.txt
    timeout -k 5 90 $D/eval_acceptance --model models/stories260K --drafter models/stories260K-$d \
      --prompts tools/train/eval_prompts.json --n 32 --max-new 192 --temperature $temp --seed 0 \
      --device cuda > $f 2>&1
    echo "-- $d T=$temp rc=$?: $(grep -hE 'tau|error|differs' $f | head -2 | tr '\n' ' ')"
  done
done

echo "== waiting for racecheck ($((SECONDS - T0)) s)"
wait $RACE_PID
sort -k2 $L/racecheck_summary.txt > $OUT/racecheck.txt
echo "racecheck: $(grep -c ' clean' $OUT/racecheck.txt) clean, $(grep -c HAZARD $OUT/racecheck.txt) hazards/failures, $(grep -c timeout $OUT/racecheck.txt) timeouts, $(grep -c not-run $OUT/racecheck.txt) not run, of $(echo "$tests" | wc -l)"
grep -v ' clean' $OUT/racecheck.txt | head -20

echo "== waiting for fuzz ($((SECONDS - T0)) s)"
wait $FUZZ_PID; cat $L/fuzz/fuzz_summary.txt 2>/dev/null || tail -n 20 $L/fuzz.txt
cp $L/fuzz/fuzz_summary.txt $L/fuzz/fuzz_corpus.tar.xz $OUT/ 2>/dev/null
rm -f $L/fuzz/fuzz_corpus.tar.xz
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
ls -la $OUT; echo "session9 total $((SECONDS - T0)) s"
