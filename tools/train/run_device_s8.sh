#!/usr/bin/env bash
# Issue 14's training run: DSpark and DFlash2 drafters for stories260K on one H200, then one tau
# table of all four families (DFlash and FlashMap: the shipped checkpoints in models/; DSpark and
# DFlash2: this run) from tools/train/eval.py (PyTorch reference) and bench/eval_acceptance (the
# engine, CPU and CUDA) on the held-out prompts (tools/train/eval_prompts.json).
#
#   OUT=/some/dir bash tools/train/run_device_s8.sh [cuda|cpu]
#
# From the repo root. On one H200 about 5.5 minutes of wall time: data ~55 s (the shipped run's
# data: same script, sizes and seed), both trainings side by side (DS_BUDGET / DF2_BUDGET seconds,
# default 200 each, plus ~15 s of start-up and export), evaluations of the new drafters ~40 s; the
# shipped drafters are evaluated meanwhile (engine on the CPU during the data generation, PyTorch
# and engine on the GPU during the trainings). Every stage has a time cap and its own log; a failed
# stage does not stop the others.
#
# Files under $OUT (at most 8 come back from the device):
#   checkpoints.tgz  stories260K-dspark/, stories260K-dflash2/ (config.json, model.safetensors,
#                    train_log.json); install with tools/train/install_checkpoints.sh
#   table.md         the tau table (tools/train/tau_table.py)
#   results.tgz      eval JSONs, engine outputs, every log
#   log.txt          this script's log (stage times and return codes, training summaries)
#
# The engine part uses build-cuda/dist/eval_acceptance: carry build-cuda/pack-train, made here by
# `bash tools/train/pack_eval.sh` from a CUDA build (or build-cuda/dist of tools/device/make_dist.sh);
# on a machine without it, build/eval_acceptance; without either it is skipped.
# SMOKE=1: toy sizes (a minute or two on a CPU): SMOKE=1 OUT=/tmp/o bash $0 cpu
set -u -o pipefail
DEV=${1:-cuda}
OUT=${OUT:-out/train_s8}
WORK=${WORK:-/tmp/blockspec-train-s8}
SEED=${SEED:-0}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
T=tools/train
PROMPTS=$T/eval_prompts.json
R=$WORK/res            # everything that goes into results.tgz
CK=$WORK/ck            # the two checkpoints
mkdir -p "$OUT" "$R" "$CK"
T0=$SECONDS

if [ "${SMOKE:-0}" = 1 ]; then
  DATA_ARGS="--n-sample 48 --n-greedy 48 --n-eval 4 --len 64 --max-prefix 16"
  TRAIN_ARGS="--steps 40 --batch 8 --anchors 8 --val 16 --log-every 10"
  DS_BUDGET=${DS_BUDGET:-0}; DF2_BUDGET=${DF2_BUDGET:-0}; SLACK=150
  EV_ARGS="--max-new 32 --n-prompts 6 --subset 3"; ENGINE_ARGS="--n 3 --max-new 32"
else
  DATA_ARGS="--n-sample 32768 --n-greedy 32768 --n-eval 128 --len 256 --max-prefix 128"
  TRAIN_ARGS="--steps 50000 --batch 64 --anchors 32"
  DS_BUDGET=${DS_BUDGET:-200}; DF2_BUDGET=${DF2_BUDGET:-200}; SLACK=60  # start-up, export
  EV_ARGS="--max-new 192 --subset 32"; ENGINE_ARGS="--n 32 --max-new 192"
fi
# The shipped DFlash drafter's backbone (docs/TRAINING.md §2), shared by both new families.
BACKBONE="--layers 2 --taps 1,2,3 --inter 512 --gamma 7 --lr 3e-3 --seed $SEED"

log() { echo "== [$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }
# stage NAME CAP_SECONDS LOGFILE cmd...: runs cmd with a time cap, output to LOGFILE, logs rc.
stage() {
  local name=$1 cap=$2 logf=$3; shift 3
  local t=$SECONDS
  timeout -k 20 "$cap" "$@" > "$logf" 2>&1
  local rc=$?
  log "$name: rc $rc in $((SECONDS - t)) s (cap $cap s)$([ $rc = 124 ] && echo ', TIMED OUT')"
  return $rc
}

: > "$OUT/log.txt"
log "start $(date -u) device $DEV seed $SEED budgets dspark $DS_BUDGET s, dflash2 $DF2_BUDGET s"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/log.txt"
timeout 60 $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tee -a "$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$OUT/log.txt"

# The engine binary and its libraries: build-cuda/dist (tools/device/make_dist.sh), or unpacked
# from build-cuda/pack-train/eval_dist.tar.xz (tools/train/pack_eval.sh), or a local build/.
EA=""
if [ ! -x build-cuda/dist/eval_acceptance ] && [ -f build-cuda/pack-train/eval_dist.tar.xz ]; then
  mkdir -p build-cuda && tar -C build-cuda -xJf build-cuda/pack-train/eval_dist.tar.xz &&
    log "engine: unpacked build-cuda/pack-train/eval_dist.tar.xz"
fi
if [ -x build-cuda/dist/eval_acceptance ]; then
  EA=build-cuda/dist/eval_acceptance
  export LD_LIBRARY_PATH=$PWD/build-cuda/dist/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
  L=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$L" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$L")
elif [ -x build/eval_acceptance ]; then
  EA=build/eval_acceptance
fi
ENGINE_BACKENDS="cpu"
[ "$DEV" = cuda ] && ENGINE_BACKENDS="cpu cuda"
log "engine: ${EA:-none (engine figures skipped)}, backends $ENGINE_BACKENDS"

# engine_runs "BACKENDS" DIR RUN... : eval_acceptance on one drafter for each RUN =
# TAG:T[:EXTRA flags] and each backend of BACKENDS that ENGINE_BACKENDS has (cpu, cuda); the CPU
# runs in parallel (one thread each) while the CUDA runs go one after the other. Output
# files as tau_table.py reads them: $R/engine_<backend>_<TAG>.txt, TAG = eval.py's run name with
# '_' for spaces and no '=' (e.g. "dspark T=0" -> dspark_T0).
engine_runs() {
  local want=$1 dir=$2; shift 2
  [ -n "$EA" ] || return 0
  [ -f "$dir/model.safetensors" ] || { log "engine: no checkpoint in $dir, skipped"; return 0; }
  local backend spec name temp extra pids="" backends=""
  for backend in $want; do [[ " $ENGINE_BACKENDS " == *" $backend "* ]] && backends="$backends $backend"; done
  for backend in $backends; do
    for spec in "$@"; do
      IFS=: read -r name temp extra <<< "$spec"
      local f=$R/engine_${backend}_${name}.txt
      if [ "$backend" = cpu ]; then
        timeout -k 10 90 $EA --model models/stories260K --drafter "$dir" --prompts $PROMPTS \
          $ENGINE_ARGS --temperature "$temp" --seed $SEED --device cpu --threads 1 $extra \
          > "$f" 2>&1 &
        pids="$pids $!"
      else
        timeout -k 10 60 $EA --model models/stories260K --drafter "$dir" --prompts $PROMPTS \
          $ENGINE_ARGS --temperature "$temp" --seed $SEED --device cuda $extra > "$f" 2>&1
        echo "rc $?" >> "$f"
      fi
    done
  done
  [ -n "$pids" ] && wait $pids
  for backend in $backends; do
    for spec in "$@"; do
      IFS=: read -r name temp extra <<< "$spec"
      echo "engine $backend $name: $(grep -hE 'tau|error' "$R/engine_${backend}_${name}.txt" | head -2 | tr '\n' ' ')"
    done
  done | tee -a "$OUT/log.txt"
}

# The shipped drafters' runs: the engine on the CPU while the data is generated (the data is on
# the critical path: nothing else uses the GPU then), PyTorch and the engine on CUDA during the
# trainings (those are bounded by wall time, so this costs them a few steps, not the run time).
DFLASH_RUNS="dflash_T0:0 dflash_T1:1"
FLASHMAP_RUNS="flashmap_1j_T0:0:--flashmap-steps=1 flashmap_1j_T1:1:--flashmap-steps=1"
shipped_engine() {
  engine_runs "$1" models/stories260K-dflash $DFLASH_RUNS
  engine_runs "$1" models/stories260K-flashmap $FLASHMAP_RUNS \
    flashmap_4j_T0_noise0:0:"--flashmap-steps=4 --noise-scale=0"
}

# 1. Data (the same call as the shipped run's, without the transformers parity check); the
#    shipped drafters on the engine's CPU backend meanwhile.
shipped_engine cpu &
PID_ENS_CPU=$!

stage data 150 "$R/log_data.txt" $PY $T/data.py --out "$WORK/data.pt" --device "$DEV" \
  --seed $SEED $DATA_ARGS --no-hf-parity
grep -E "sampled|greedy cont|tokens:" "$R/log_data.txt" | tee -a "$OUT/log.txt"
if [ "${SMOKE:-0}" != 1 ] && [ -f "$WORK/eval_prompts.json" ]; then
  if cmp -s "$WORK/eval_prompts.json" $PROMPTS; then
    log "data: eval_prompts.json identical to the committed one (same generator streams)"
  else
    log "data: eval_prompts.json DIFFERS from the committed one (kept as data_eval_prompts.json)"
    cp "$WORK/eval_prompts.json" "$R/data_eval_prompts.json"
  fi
fi

# 2. DSpark (block 8: 8 drafts; Markov rank 64) and DFlash2 (block 16: 15 drafts; convs in groups
#    of 16, selector rank 32, top-16) side by side; the shipped drafters on the GPU meanwhile.
(
  stage eval_shipped 180 "$R/log_eval_shipped.txt" $PY $T/eval.py --prompts $PROMPTS \
    --dflash models/stories260K-dflash --flashmap models/stories260K-flashmap --device "$DEV" \
    --seed $SEED --jumps 1,4 --temps 0,1 --zero-noise $EV_ARGS --json "$R/eval_shipped.json"
  grep -E "tau" "$R/log_eval_shipped.txt" | grep -v "^|" | tee -a "$OUT/log.txt"
) &
PID_EVS=$!
shipped_engine cuda &
PID_ENS_CUDA=$!
if [ -f "$WORK/data.pt" ]; then
  stage train_dspark $((DS_BUDGET + SLACK)) "$R/log_dspark.txt" $PY $T/dspark.py \
    --data "$WORK/data.pt" --out "$CK/stories260K-dspark" --device "$DEV" $BACKBONE \
    --block-size 8 --rank 64 $TRAIN_ARGS --time-budget "$DS_BUDGET" &
  PID_DS=$!
  stage train_dflash2 $((DF2_BUDGET + SLACK)) "$R/log_dflash2.txt" $PY $T/dflash2.py \
    --data "$WORK/data.pt" --out "$CK/stories260K-dflash2" --device "$DEV" $BACKBONE \
    --block-size 16 --group 16 --rank 32 --top-k 16 $TRAIN_ARGS --time-budget "$DF2_BUDGET" &
  PID_DF2=$!
  wait $PID_DS $PID_DF2
  tail -n 4 "$R/log_dspark.txt" "$R/log_dflash2.txt" | tee -a "$OUT/log.txt"
else
  log "no data: trainings skipped"
fi
# The checkpoints first, in case anything later fails.
CKS=()
for d in stories260K-dspark stories260K-dflash2; do [ -d "$CK/$d" ] && CKS+=("$d"); done
if [ ${#CKS[@]} -gt 0 ]; then
  tar czf "$OUT/checkpoints.tgz" -C "$CK" "${CKS[@]}" &&
    log "checkpoints.tgz: $(tar tzf "$OUT/checkpoints.tgz" | tr '\n' ' ')"
fi

# 3. The new drafters (PyTorch and engine); then wait for the shipped drafters' evaluations.
EV_NEW=""
[ -f "$CK/stories260K-dspark/model.safetensors" ] && EV_NEW="$EV_NEW --dspark $CK/stories260K-dspark"
[ -f "$CK/stories260K-dflash2/model.safetensors" ] && EV_NEW="$EV_NEW --dflash2 $CK/stories260K-dflash2"
if [ -n "$EV_NEW" ]; then
  (
    stage eval_new 120 "$R/log_eval_new.txt" $PY $T/eval.py --prompts $PROMPTS $EV_NEW \
      --device "$DEV" --seed $SEED --temps 0,1 $EV_ARGS --json "$R/eval_new.json"
    grep -E "tau" "$R/log_eval_new.txt" | grep -v "^|" | tee -a "$OUT/log.txt"
  ) &
  PID_EVN=$!
  # The trainer's drafts against the independent references (CPU), also with perturbed heads.
  (
    stage check_reference 90 "$R/log_check_reference.txt" $PY $T/check_reference.py $EV_NEW \
      --prompts $PROMPTS --n 16 --perturb
    grep -E "prompts, drafts" "$R/log_check_reference.txt" | tee -a "$OUT/log.txt"
  ) &
  PID_CHK=$!
  engine_runs "cpu cuda" "$CK/stories260K-dspark" dspark_T0:0 dspark_T1:1
  engine_runs "cpu cuda" "$CK/stories260K-dflash2" dflash2_T0:0 dflash2_T1:1
  wait $PID_EVN $PID_CHK
fi
wait $PID_EVS $PID_ENS_CPU $PID_ENS_CUDA

# 4. The table, the results.
timeout 60 $PY $T/tau_table.py --eval "$R/eval_shipped.json" "$R/eval_new.json" --engine "$R" \
  > "$OUT/table.md" 2> "$R/log_table.txt"
cat "$OUT/table.md" | tee -a "$OUT/log.txt"
cp "$OUT/log.txt" "$R/"
tar czf "$OUT/results.tgz" -C "$R" .
log "done $(date -u); files: $(ls "$OUT" | tr '\n' ' ')"
