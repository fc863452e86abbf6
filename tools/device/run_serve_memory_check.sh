#!/bin/bash
# Runs on the GPU machine from the repo root: `blockspec serve --device cuda` sizing its KV cache
# from free GPU memory (synthetic Qwen3-8B + DFlash-b16), the errors before listening, and one
# greedy completion from the served model compared with `blockspec generate`. Logs under $OUT.
set -u
. tools/device/device_env.sh
S=/tmp/synth; [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] && S=/dev/shm/synth
[ -e $S/qwen3-8b-dflash-b16-acc100 ] || $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 > $OUT/synth.txt 2>&1
echo "synth rc=$?"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/gpu_memory.txt
M="--model $S/qwen3-8b --drafter $S/qwen3-8b-dflash-b16-acc100 --device cuda"
# serve ARGS...: starts the server, prints its listening (or error) line, completes one prompt
# when it listens, stops it.
serve() {
  local log=$OUT/serve_$#_$RANDOM.txt
  $B serve $M --port 0 "$@" > $log 2>&1 &
  local pid=$!
  for _ in $(seq 180); do grep -qE "listening|error" $log && break; sleep 1; done
  echo "--- serve $*"; grep -E "listening|error" $log
  local port=$(grep -oE "127.0.0.1:[0-9]+" $log | head -1 | cut -d: -f2)
  if [ -n "$port" ]; then
    curl -s localhost:$port/v1/completions -H 'Content-Type: application/json' \
      -d '{"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}' > $OUT/completion.json
    python3 -c "import json,sys; print('completion:', repr(json.load(open(sys.argv[1]))['choices'][0]['text']))" $OUT/completion.json
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
}
serve                                   # default: 8 full 40,960-token windows
serve --max-num-seqs 64                 # wants more than the GPU holds: shrunk
serve --memory-utilization 0.3 --max-num-seqs 4
serve --memory-utilization 0.1          # the weights alone exceed it: refused
serve --kv-cache-tokens 100000000       # explicit size that cannot fit: refused
$B generate $M --prompt "The quick brown fox" --max-tokens 24 > $OUT/generate.txt 2>$OUT/generate_err.txt
echo "generate: $(python3 -c "import sys; print(repr(open(sys.argv[1]).read()))" $OUT/generate.txt)"
