#!/usr/bin/env bash
# The whole training run of the stories260K drafters, as done on the GPU machine (one H200):
# data generation, DFlash and FlashMap training (in parallel, wall-clock budgeted), evaluation.
#
#   OUT=/some/dir bash tools/train/run_device.sh [cuda|cpu]
#
# Results: $OUT/results.tgz (stories260K-dflash/, stories260K-flashmap/, eval.json,
# eval_prompts.json, logs), $OUT/log*.txt. Working files (data.pt) stay in $WORK.
# Budgets are seconds of wall time per stage (see docs/TRAINING.md); SMOKE=1 runs a tiny version.
set -u -o pipefail
DEV=${1:-cuda}
OUT=${OUT:-out/train}
WORK=${WORK:-/tmp/blockspec-train}
SEED=${SEED:-0}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK/res"
T=tools/train
if [ "${SMOKE:-0}" = 1 ]; then
  DATA_ARGS="--n-sample 24 --n-greedy 24 --n-eval 4 --len 48 --max-prefix 16"
  DF_ARGS="--steps 3 --batch 4 --anchors 4 --val 8 --log-every 1"
  FM_ARGS="--teacher-steps 3 --distill-steps 2 --batch 4 --anchors 4 --distill-batch 2 --distill-anchors 2 --val 8 --log-every 1"
  EV_ARGS="--max-new 12 --n-prompts 3"
else
  DATA_ARGS="--n-sample 32768 --n-greedy 32768 --n-eval 128 --len 256 --max-prefix 128"
  DF_ARGS="--steps 50000 --time-budget ${DF_BUDGET:-230} --batch 64 --anchors 32"
  FM_ARGS="--teacher-steps 50000 --teacher-budget ${FMA_BUDGET:-110} --distill-steps 20000 --distill-budget ${FMB_BUDGET:-100}"
  EV_ARGS="--max-new 192"
fi

echo "== $(date -u) device $DEV seed $SEED" | tee "$OUT/log.txt"
$PY -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tee -a "$OUT/log.txt"

$PY $T/data.py --out "$WORK/data.pt" --device "$DEV" --seed "$SEED" $DATA_ARGS 2>&1 | tee -a "$OUT/log.txt"
cp "$WORK/eval_prompts.json" "$WORK/res/"

# DFlash and FlashMap train side by side (tiny models: the GPU is mostly idle between kernels).
$PY $T/dflash.py --data "$WORK/data.pt" --out "$WORK/res/stories260K-dflash" --device "$DEV" \
  --seed "$SEED" --layers 2 --block-size 16 --taps 1,2,3 --inter 512 --gamma 7 --lr 3e-3 \
  $DF_ARGS > "$OUT/log_dflash.txt" 2>&1 &
PID_DF=$!
$PY $T/flashmap.py --data "$WORK/data.pt" --out "$WORK/res/stories260K-flashmap" --device "$DEV" \
  --seed "$SEED" --hidden 128 --layers 2 --heads 8 --head-dim 16 --inter 256 --temb 64 \
  --block-size 15 --taps 1,2,3 --gamma 7 $FM_ARGS > "$OUT/log_flashmap.txt" 2>&1 &
PID_FM=$!
wait $PID_DF; RC_DF=$?
wait $PID_FM; RC_FM=$?
echo "== dflash rc $RC_DF, flashmap rc $RC_FM" | tee -a "$OUT/log.txt"
tail -n 8 "$OUT/log_dflash.txt" "$OUT/log_flashmap.txt" | tee -a "$OUT/log.txt"
cp "$OUT"/log_*.txt "$WORK/res/"
tar czf "$OUT/results.tgz" -C "$WORK/res" .   # in case the evaluation does not finish

EV_DRAFTERS=""
[ -f "$WORK/res/stories260K-dflash/model.safetensors" ] && EV_DRAFTERS="$EV_DRAFTERS --dflash $WORK/res/stories260K-dflash"
[ -f "$WORK/res/stories260K-flashmap/model.safetensors" ] && EV_DRAFTERS="$EV_DRAFTERS --flashmap $WORK/res/stories260K-flashmap"
$PY $T/eval.py --prompts "$WORK/eval_prompts.json" $EV_DRAFTERS --device "$DEV" --seed "$SEED" \
  --jumps 1,2,4 --temps 0,1 --zero-noise $EV_ARGS --json "$WORK/res/eval.json" 2>&1 | tee -a "$OUT/log.txt"
cp "$OUT/log.txt" "$WORK/res/"
tar czf "$OUT/results.tgz" -C "$WORK/res" .
ls -la "$OUT" "$WORK/res"
echo "== done $(date -u)"
