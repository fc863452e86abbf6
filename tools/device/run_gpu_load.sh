#!/bin/bash
# Runs on the GPU machine from the repo root (issue 18, docs/RELIABILITY.md "Load on the GPU"):
# the load driver (build-cuda/dist/server_load_test, tests/e2e/server_load_test.cc) against
# `blockspec serve --device cuda`, three servers one after the other:
#   stories - stories260K + its shipped DFlash drafter (real text, so greedy outputs are compared
#             token for token), context 512, prompts up to 400 tokens + 96 generated and 4 of
#             376-504 tokens + 8 (up to the window), KV cache of two windows (1,024 positions:
#             most of the 256 clients wait);
#   qwen    - synthetic Qwen3-8B + DFlash-b16 (blockspec synth), the model's 40,960-token context,
#             LONG prompts a wave ending 8 to 1,508 tokens short of the window among the short
#             ones, KV cache of 1.25 windows (51,200 positions: a long request waits for the other);
#   preempt - the same with --preemption, context 8,192 (prompts near it), KV cache 12,288.
# Each: the cases alone first (the single-request outputs), then WAVES waves of 256 clients; the
# driver checks 0 lost, greedy outputs equal, idle after each wave, server RSS stable; this script
# checks that the server is still alive after the waves (0 crashes) and stops it with SIGTERM.
# Uses the carried build-cuda/dist (device_env.sh). Logs under $OUT (gpuload.txt: the summary;
# the servers' logs stay in /tmp/gpuload). BUDGET (default 240 s) skips the runs that would start
# after it. Sections as arguments (default: stories qwen preempt).
set -u
OUT=${OUT:-/tmp/gpuload_out}
mkdir -p "$OUT"
. tools/device/device_env.sh
L=/tmp/gpuload
mkdir -p $L
T0=$SECONDS
BUDGET=${BUDGET:-240}
ARGS="${*:-stories qwen preempt}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
SUMMARY=$OUT/gpuload.txt
say() { echo "$*" | tee -a "$SUMMARY"; }
S=/tmp/synth; [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] && S=/dev/shm/synth
# The synthetic checkpoints, once, when a run needs them and the budget allows it.
synth() {
  ((SECONDS - T0 > BUDGET)) && return
  [ -e $S/qwen3-8b-dflash-b16-acc100 ] && return
  timeout 150 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > $L/synth.txt 2>&1
  say "synth rc=$? ($((SECONDS - T0)) s)"
}

# run NAME "SERVE FLAGS" "DRIVER ENV": one server, the driver, the crash check.
run() {
  local name=$1 flags=$2 envs=$3
  if ((SECONDS - T0 > BUDGET)); then say "=== $name: SKIPPED (budget ${BUDGET} s spent)"; return; fi
  say "=== $name: serve $flags"
  $B serve $flags --device ${DEVICE:-cuda} --port 0 > $L/serve_$name.txt 2>&1 &
  local pid=$!
  for _ in $(seq 180); do grep -qE "listening|error" $L/serve_$name.txt && break; sleep 1; done
  grep -E "listening|error" $L/serve_$name.txt | head -3 | tee -a "$SUMMARY"
  local port=$(grep -oE "127.0.0.1:[0-9]+" $L/serve_$name.txt | head -1 | cut -d: -f2)
  if [ -z "$port" ]; then say "FAIL $name: serve did not start"; kill $pid 2>/dev/null; return; fi
  say "started in $((SECONDS - T0)) s"
  env BLOCKSPEC_LOAD_PORT=$port BLOCKSPEC_LOAD_PID=$pid $envs timeout 600 $D/server_load_test \
    --gtest_filter='ServerLoad.*' > $L/driver_$name.txt 2>&1
  local rc=$?
  grep -E "^LOAD|Failure|lost:|greedy case|grew|\[  (PASSED|FAILED|SKIPPED) " $L/driver_$name.txt |
    head -40 | tee -a "$SUMMARY"
  local alive=no; kill -0 $pid 2>/dev/null && alive=yes
  kill $pid 2>/dev/null; wait $pid; local st=$?
  local verdict=PASS; [ $rc = 0 ] && [ $alive = yes ] || verdict=FAIL
  say "$verdict $name: driver rc=$rc, server alive after the waves: $alive, exit status after SIGTERM $st, errors in its log: $(grep -c 'error' $L/serve_$name.txt) ($((SECONDS - T0)) s)"
}

want stories && run stories \
  "--model models/stories260K --drafter models/stories260K-dflash --max-model-len 512 --kv-cache-tokens 1024" \
  "BLOCKSPEC_LOAD_VOCAB=500 BLOCKSPEC_LOAD_MAX_PROMPT=400 BLOCKSPEC_LOAD_MAX_MODEL_LEN=512 BLOCKSPEC_LOAD_LONG=4"
Q="--model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100"
{ want qwen || want preempt; } && synth
want qwen && run qwen "$Q --kv-cache-tokens 51200" \
  "BLOCKSPEC_LOAD_MAX_MODEL_LEN=40960 BLOCKSPEC_LOAD_LONG=${LONG:-3} BLOCKSPEC_LOAD_MAX_PROMPT=2000 BLOCKSPEC_LOAD_WAVES=${WAVES:-2}"
want preempt && run preempt "$Q --preemption --max-model-len 8192 --kv-cache-tokens 12288" \
  "BLOCKSPEC_LOAD_MAX_MODEL_LEN=8192 BLOCKSPEC_LOAD_LONG=4 BLOCKSPEC_LOAD_MAX_PROMPT=2000 BLOCKSPEC_LOAD_WAVES=${WAVES:-2}"
# The drivers' and servers' last lines (the whole logs stay in $L).
for f in $L/driver_*.txt $L/serve_*.txt; do echo "--- $f"; tail -n 15 "$f"; done > $OUT/gpuload_logs.txt 2>&1
say "=== gpuload: $(grep -c '^PASS' "$SUMMARY") passed, $(grep -c '^FAIL' "$SUMMARY") failed ($((SECONDS - T0)) s)"
