#!/bin/bash
# Runs on the GPU machine from the repo root, after unpacking build-cuda/pack/dist.tar.xz into
# build-cuda/ (tools/device/pack_session8.sh made build-cuda/pack here): the merged main's one
# closing call of session 8, sharing one machine's ~10 minutes between
#   fuzz   - tools/device/run_fuzz_long.sh in the background on FUZZ_CORES cores (issue 18),
#   train  - tools/train/run_device_s8.sh in the background from the start: DSpark and DFlash2
#            drafters for stories260K and the tau table of the four families (issue 14),
#   tests  - the CUDA suites (cuda_ops_test, cuda_models_test, bench_cli_test, one process per
#            test; run_session7.sh tests) beside the training: correctness only, no timings,
#   budget - greedy generate with --verify-budget auto vs plain on the GPU, every drafter family
#            of tests/data (issue 14's verify-length scheduling),
#   serve  - tools/device/run_serve_s8.sh once the training has ended (issue 15; its timings are
#            taken with the GPU to itself, the fuzzers on other cores).
# TOTAL_S (default 560) bounds the whole run. Files into $OUT (at most 8): session.txt (every
# summary), table.md and checkpoints.tgz (the training), serve_summary.txt, fuzz_summary.txt,
# fuzz_corpus.tar.xz, logs.tgz (every other log).
set -u
T0=$SECONDS
TOTAL_S=${TOTAL_S:-560}
LOG=$OUT/session.txt
exec > >(tee -a "$LOG") 2>&1
. tools/device/device_env.sh
print_machine; echo "TOTAL_S $TOTAL_S"
L=/tmp/s8b; rm -rf $L; mkdir -p $L/fuzz $L/train $L/tests $L/serve $L/budget

OUT=$L/fuzz CORES=${FUZZ_CORES:-6} bash tools/device/run_fuzz_long.sh "$((TOTAL_S - 40))" \
  "${FUZZ_TARGET:-10000000}" > $L/fuzz.txt 2>&1 &
FUZZ_PID=$!
OUT=$L/train DS_BUDGET=${DS_BUDGET:-150} DF2_BUDGET=${DF2_BUDGET:-150} \
  timeout -k 10 $((TOTAL_S - 200)) bash tools/train/run_device_s8.sh cuda > $L/train.txt 2>&1 &
TRAIN_PID=$!
# The serving target is written while the GPU is busy elsewhere (CPU and /dev/shm only).
timeout 180 $B synth --preset qwen3-8b --out /dev/shm/synth/qwen3-8b --drafter dflash-b16 \
  --acceptance 100 > $L/serve/synth.txt 2>&1 &
SYNTH_PID=$!
echo "== fuzz ($FUZZ_PID), train ($TRAIN_PID), synth ($SYNTH_PID) started"

echo "== tests ($((SECONDS - T0)) s)"
OUT=$L/tests timeout -k 5 300 bash tools/device/run_session7.sh tests 2>&1 | grep -v "^NVIDIA"

echo "== verify budget ($((SECONDS - T0)) s): greedy generate, --verify-budget auto vs plain"
P="Once upon a time, there was a little girl named Lily. She"
timeout 30 $B generate --model models/stories260K --device cuda --prompt "$P" --max-tokens 96 \
  --temperature 0 > $L/budget/plain.txt 2> $L/budget/plain.err
for d in dflash-stories260K dspark-stories260K dflash2-stories260K flashmap-stories260K; do
  timeout 60 $B generate --model models/stories260K --drafter tests/data/$d --device cuda \
    --prompt "$P" --max-tokens 96 --temperature 0 --verify-budget auto > $L/budget/$d.txt 2> $L/budget/$d.err
  rc=$?
  if cmp -s $L/budget/plain.txt $L/budget/$d.txt; then r="equal to plain"; else r="DIFFERENT from plain"; fi
  echo "-- $d rc=$rc: $r; $(grep -m1 -o 'acceptance length [0-9.]*' $L/budget/$d.err)"
done

echo "== waiting for the training ($((SECONDS - T0)) s)"
wait $TRAIN_PID; echo "train rc=$? ($((SECONDS - T0)) s)"; tail -n 25 $L/train/log.txt
cp $L/train/table.md $L/train/checkpoints.tgz $OUT/ 2>/dev/null
wait $SYNTH_PID; echo "synth rc=$?"
left=$((TOTAL_S - 25 - (SECONDS - T0)))
if ((left > 60)); then
  echo "== serve ($((SECONDS - T0)) s, budget $((left - 40)) s)"
  OUT=$L/serve BUDGET=$((left - 40)) timeout -k 5 $left bash tools/device/run_serve_s8.sh 2>&1 | tail -n 60
  cp $L/serve/summary.txt $OUT/serve_summary.txt 2>/dev/null
else
  echo "== serve skipped: $left s left"
fi

echo "== waiting for fuzz ($((SECONDS - T0)) s)"
wait $FUZZ_PID; cat $L/fuzz/fuzz_summary.txt 2>/dev/null || tail -n 20 $L/fuzz.txt
cp $L/fuzz/fuzz_summary.txt $L/fuzz/fuzz_corpus.tar.xz $OUT/ 2>/dev/null
rm -f $L/fuzz/fuzz_corpus.tar.xz
tar -C $L -czf $OUT/logs.tgz --exclude='*.safetensors' --exclude=checkpoints.tgz . 2>/dev/null
ls -la $OUT; echo "session8b total $((SECONDS - T0)) s"
