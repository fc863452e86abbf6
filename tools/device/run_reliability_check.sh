#!/bin/bash
# Runs on the GPU machine from the repo root (issue 18, "never die, never lose"; docs/RELIABILITY.md):
# `blockspec serve` with default flags (memory utilization 0.9, 8 sequences, the model's 40,960
# context, chunked prefill of 2,048) over a synthetic Qwen3-8B + DFlash-b16 must
#   1. answer a 23,174-token prompt (the prompt that ended the process before) and a prompt of
#      max_model_len - 1 tokens with 200, refuse one of max_model_len tokens with 400 before any
#      work, and still answer a short request afterwards;
#   2. with BLOCKSPEC_FAIL_ALLOC_AT=1 (the first device allocation after it listens fails), answer
#      that request with 503 and keep serving: the next requests get 200.
# Uses the carried build-cuda/dist binaries (device_env.sh); builds blockspec when they are
# missing. Logs under $OUT; a summary in $OUT/summary.txt. About 4-6 minutes.
set -u
OUT=${OUT:-/tmp/reliability_out}
mkdir -p "$OUT"
if [ ! -x build-cuda/dist/blockspec ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/build.txt" 2>&1 &&
    cmake --build build-cuda -j"$(nproc)" --target blockspec >> "$OUT/build.txt" 2>&1 ||
    { echo "build failed (see build.txt)"; tail -20 "$OUT/build.txt"; exit 1; }
  mkdir -p build-cuda/dist/lib && cp build-cuda/blockspec build-cuda/dist/blockspec
fi
. tools/device/device_env.sh
S=/tmp/synth; [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] && S=/dev/shm/synth
[ -e $S/qwen3-8b-dflash-b16-acc100 ] ||
  $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > "$OUT/synth.txt" 2>&1
echo "synth rc=$?"
M="--model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

PID=
PORT=
# start NAME [ENV=VALUE...]: serve with default flags; waits until it listens (or fails).
start() {
  local name=$1; shift
  env "$@" $B serve $M --port 0 > "$OUT/serve_$name.txt" 2>&1 &
  PID=$!
  for _ in $(seq 240); do grep -qE "listening|error" "$OUT/serve_$name.txt" && break; sleep 1; done
  grep -E "listening|error|BLOCKSPEC_FAIL" "$OUT/serve_$name.txt" | tee -a "$SUMMARY"
  PORT=$(grep -oE "127.0.0.1:[0-9]+" "$OUT/serve_$name.txt" | head -1 | cut -d: -f2)
}
stop() {
  local alive=no; kill -0 "$PID" 2>/dev/null && alive=yes
  kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null
  say "server alive before SIGTERM: $alive (exit status $?)"
}
# request NAME PROMPT_TOKENS MAX_TOKENS EXPECTED_STATUS [TEMPERATURE]: a completion of
# PROMPT_TOKENS random token ids (seeded by NAME) through /v1/completions (greedy by default).
request() {
  local name=$1 n=$2 max=$3 want=$4 temp=${5:-0}
  python3 - "$n" "$max" "$name" "$temp" > "$OUT/req_$name.json" <<'EOF'
import json, random, sys
n, max_tokens, name, temp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
rng = random.Random(name)
print(json.dumps({"prompt": [rng.randrange(1000, 100000) for _ in range(n)],
                  "max_tokens": max_tokens, "temperature": temp, "seed": 7}))
EOF
  local t0=$(date +%s.%N)
  local code=$(curl -s -o "$OUT/resp_$name.json" -w '%{http_code}' --max-time 300 \
    "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' -d @"$OUT/req_$name.json")
  local t1=$(date +%s.%N)
  local detail=$(python3 -c "
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print('unreadable reply'); sys.exit()
if 'error' in r: print('error:', r['error'].get('message', '')[:300])
else: print('usage', r.get('usage'), 'finish', r['choices'][0].get('finish_reason'))
" "$OUT/resp_$name.json")
  local verdict=PASS; [ "$code" = "$want" ] || verdict=FAIL
  say "$verdict $name: $n prompt tokens, max_tokens $max: HTTP $code (want $want) in $(python3 -c "print(f'{$t1-$t0:.1f}')") s; $detail"
}

nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu_memory.txt"
say "=== 1. default flags: long prompts"
start defaults
if [ -n "$PORT" ]; then
  request short_before 32 16 200
  request incident_23174 23174 16 200
  request max_model_len 40959 1 200
  request too_long 40960 1 400
  request short_after 32 16 200
  curl -s "localhost:$PORT/metrics" > "$OUT/metrics_defaults.txt"
  nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/gpu_memory.txt"
  stop
else
  say "FAIL: serve did not start"; kill "$PID" 2>/dev/null
fi

say "=== 2. injected allocation failure (BLOCKSPEC_FAIL_ALLOC_AT=1)"
start fault BLOCKSPEC_FAIL_ALLOC_AT=1
if [ -n "$PORT" ]; then
  # Greedy steps of the sizes the start-up warm-up ran allocate nothing new; a sampled request's
  # first draw allocates the sampling buffers, so the first request below certainly allocates.
  request injected 3000 16 503 0.8
  request after_fault_1 3000 16 200 0.8
  request after_fault_2 32 16 200
  stop
else
  say "FAIL: serve did not start"; kill "$PID" 2>/dev/null
fi
grep -hE "error|out of" "$OUT"/serve_*.txt | head -20 > "$OUT/serve_errors.txt"
say "=== $(grep -c ^PASS "$SUMMARY") passed, $(grep -c ^FAIL "$SUMMARY") failed"
