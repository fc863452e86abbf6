#!/bin/bash
# Runs on the GPU machine from the repo root (binaries carried in build-cuda/dist, see
# make_dist.sh): issue 15's measurements. Sections by argument (default: all):
#   tests   - cuda_ops_test and cuda_models_test (one process each)
#   prefill - synthetic Qwen3-8B + forced-100% DFlash-b16: bench at 512 and 8,192 tokens, with
#             the flash prefill kernel and without (BLOCKSPEC_FLASH_PREFILL=0)
#   serve   - blockspec serve (plain, then the forced-100% drafter) driven by bench-serve at
#             1 / 8 / 32 clients, and a 5,794-token prompt's TTFT; bench --batch 8 / 32 to compare
# Logs under $OUT; a section is skipped once $BUDGET seconds (default 540) have passed.
set -u
. tools/device/device_env.sh
# The tests' data path is the build machine's source tree (make_dist.sh recorded it): link it here.
T0=$SECONDS; BUDGET=${BUDGET:-540}
left() { [ $((SECONDS - T0)) -lt "$BUDGET" ] || { echo "(skipped: $1, ${SECONDS}s)"; return 1; }; }
want() { [ $# -eq 0 ] || [[ " $ARGS " == *" $1 "* ]]; }
ARGS="${*:-tests prefill serve}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/env.txt
S=/dev/shm/synth
M="--model $S/qwen3-8b"; DR="--drafter $S/qwen3-8b-dflash-b16-acc100"
if want tests; then
  for t in cuda_ops_test cuda_models_test; do
    timeout 240 $D/$t > $OUT/$t.txt 2>&1; echo "== $t rc=$? ($((SECONDS - T0))s)"
    grep -E "^\[  (PASSED|FAILED) |Failure|rel err|first diff" $OUT/$t.txt | head -20
  done
fi
$B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > $OUT/synth.txt 2>&1
echo "synth rc=$? ($((SECONDS - T0))s)"
bench() {  # NAME ARGS...: one bench run, its key lines
  local name=$1; shift
  left "$name" || return
  timeout 150 $B bench "$@" --device cuda > $OUT/bench_$name.txt 2>&1
  echo "-- $name rc=$? ($((SECONDS - T0))s)"
  grep -E "^prefill|step|generate|output ==|batch|error" $OUT/bench_$name.txt
}
if want prefill; then
  bench ctx512 $M $DR --iters 30 --context 512 --gen-tokens 256
  BLOCKSPEC_FLASH_PREFILL=0 bench ctx512_noflash $M --iters 5 --context 512 --gen-tokens 16
  bench ctx8192 $M $DR --iters 10 --context 8192 --gen-tokens 64
  BLOCKSPEC_FLASH_PREFILL=0 bench ctx8192_noflash $M --iters 3 --context 8192 --gen-tokens 16
fi
serve_bench() {  # NAME SERVE-ARGS...: serve, then bench-serve at 1 / 8 / 32 clients and a long prompt
  local name=$1; shift
  left "serve $name" || return
  $B serve $M "$@" --device cuda --port 18181 --max-num-seqs 32 --max-model-len 8192 > $OUT/serve_$name.log 2>&1 &
  local pid=$!
  $B bench-serve --port 18181 --wait 120 --clients 1 --requests 1 --output-tokens 8 > /dev/null 2>&1  # warm-up
  for c in 1 8 32; do
    left "bench-serve $name $c" || break
    timeout 100 $B bench-serve --port 18181 --clients $c --requests $((c * 2)) --prompt-tokens 128 --output-tokens 256 --json > $OUT/bs_${name}_c$c.json 2>&1
    echo "-- bench-serve $name clients $c rc=$? ($((SECONDS - T0))s)"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print({k: (round(v,1) if isinstance(v,float) else v) for k,v in j.items() if not isinstance(v,dict)}); print({k: {a: round(b,2) for a,b in j[k].items()} for k in ('ttft_ms','tpot_ms','itl_ms')})" $OUT/bs_${name}_c$c.json
  done
  left "ttft $name" && timeout 60 $B bench-serve --port 18181 --clients 1 --requests 3 --prompt-tokens 5794 --output-tokens 16 > $OUT/bs_${name}_ttft5794.txt 2>&1
  grep -E "completed|TTFT|E2E" $OUT/bs_${name}_ttft5794.txt
  kill $pid; wait $pid 2>/dev/null
}
if want serve; then
  serve_bench plain --no-drafter
  serve_bench spec $DR
  bench batch8 $M $DR --iters 10 --context 512 --gen-tokens 64 --batch 8
  bench batch32 $M $DR --iters 10 --context 512 --gen-tokens 64 --batch 32
fi
echo "total $((SECONDS - T0))s"
