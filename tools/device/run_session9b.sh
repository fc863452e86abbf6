#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh with FULL=1): session 9's measuring call, ~9 minutes:
#   fuzz   - tools/device/run_fuzz_long.sh in the background on FUZZ_CORES cores at nice 10
#            (issue 18; the harnesses short of 10^7 executions),
#   tests  - the CUDA suites (run_session7.sh tests),
#   steps  - synthetic Qwen3-8B (bf16) and forced-100 % drafters: bench step times for DFlash-b16,
#            DFlash-b16 with a 32,768-token draft vocabulary (bf16 and FP8 weights), DSpark-b7 and
#            DFlash2-b16 (issues 14 and 17),
#   serve  - tools/device/run_serve_s8.sh: bench --batch N and bench-serve against serve, plain
#            and DFlash-b16 (issue 15).
# STEPS=0 leaves the step benches out. TOTAL_S (default 550) bounds the run. Files into $OUT: session.txt, serve_summary.txt,
# fuzz_summary.txt, fuzz_corpus.tar.xz, logs.tgz.
set -u
T0=$SECONDS
TOTAL_S=${TOTAL_S:-550}
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine; echo "TOTAL_S $TOTAL_S"
L=/tmp/s9b; rm -rf $L; mkdir -p $L/fuzz $L/tests $L/steps $L/serve
S=/dev/shm/synth

OUT=$L/fuzz CORES=${FUZZ_CORES:-11} WEIGHTS=${FUZZ_WEIGHTS:-"tokenizer_encode:2 jinja_template:3 chat_render:3 openai_request:3"} \
  bash tools/device/run_fuzz_long.sh "$((TOTAL_S - 40))" "${FUZZ_TARGET:-10000000}" > $L/fuzz.txt 2>&1 &
FUZZ_PID=$!
# The target is written on the CPU while the tests use the GPU.
timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  > $L/steps/synth_dflash.txt 2>&1 &
SYNTH_PID=$!
echo "== fuzz ($FUZZ_PID), synth ($SYNTH_PID) started"

echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 ${TESTS_S:-150} bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA"

wait $SYNTH_PID; echo "synth rc=$? ($((SECONDS - T0)) s)"
M="--model $S/qwen3-8b"
BENCH="--device cuda --iters 20 --context 512 --gen-tokens 256"
step() {  # name, drafter dir, extra flags
  local name=$1 dir=$2; shift 2
  timeout 90 $B bench $M --drafter $dir $BENCH "$@" > $L/steps/bench_$name.txt 2>&1
  echo "-- $name rc=$? ($((SECONDS - T0)) s)"
  grep -E "step|generate|output ==|error" $L/steps/bench_$name.txt
}
echo "== steps ($((SECONDS - T0)) s)"
if [ "${STEPS:-1}" = 1 ]; then
step dflash-b16 $S/qwen3-8b-dflash-b16-acc100
timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
  --draft-vocab 32768 --drafter-out $S/dv32k > $L/steps/synth_dv.txt 2>&1 || tail -3 $L/steps/synth_dv.txt
step dflash-b16-dv32k $S/dv32k
step dflash-b16-dv32k-fp8 $S/dv32k --drafter-fp8
step dflash-b16-fp8 $S/qwen3-8b-dflash-b16-acc100 --drafter-fp8
rm -rf $S/dv32k
for d in dspark-b7 dflash2-b16; do
  timeout 60 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter $d --acceptance 100 \
    --drafter-out $S/$d > $L/steps/synth_$d.txt 2>&1 || tail -3 $L/steps/synth_$d.txt
  step $d $S/$d
  rm -rf $S/$d
done
fi

left=$((TOTAL_S - 20 - (SECONDS - T0)))
echo "== serve ($((SECONDS - T0)) s, budget $((left - 30)) s)"
OUT=$L/serve BUDGET=$((left - 30)) BENCH_BATCHES=${BENCH_BATCHES:-"1 8 32 128"} \
  RUNS=${RUNS:-"128:256:1:2 128:256:8:2 128:256:32:2 128:256:128:2 6144:64:1:3"} \
  timeout -k 5 $left bash tools/device/run_serve_s8.sh 2>&1 | tail -n 40
cp $L/serve/summary.txt $OUT/serve_summary.txt 2>/dev/null

echo "== waiting for fuzz ($((SECONDS - T0)) s)"
wait $FUZZ_PID; cat $L/fuzz/fuzz_summary.txt 2>/dev/null || tail -n 20 $L/fuzz.txt
cp $L/fuzz/fuzz_summary.txt $L/fuzz/fuzz_corpus.tar.xz $OUT/ 2>/dev/null
rm -f $L/fuzz/fuzz_corpus.tar.xz
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
ls -la $OUT; echo "session9b total $((SECONDS - T0)) s"
