#!/bin/bash
# Runs on the GPU machine from the repo root (binaries carried in build-cuda/dist, see
# make_dist.sh): issue 15's serving measurements in one call of at most ~5 minutes.
#   synthetic Qwen3-8B target (blockspec synth, in /dev/shm), served plain (--no-drafter) and with
#   DFlash-b16 forced to 100 % acceptance, driven by bench-serve at 1 / 8 / 32 / 128 clients with
#   128-token prompts (256 new tokens), 1 / 32 clients with 2,048-token prompts (128 new) and
#   1 / 8 clients with 8,192-token prompts (64 new); and first `bench --batch N` (N = 1 / 8 / 32 / 128,
#   256 new tokens, prompts as long as the first run's: 128 tokens, --prompt-tokens; --kernels: the
#   batched decode step op by op) for the engine's own figure; a table of served / bench to stdout and
#   $OUT/summary.txt. Servers run with BLOCKSPEC_PROFILE_HOST=1: their per-step host profile lines
#   (docs/SERVER.md) are in the summary too.
# A dry run on the CPU: PRESET=tiny DEV=cpu MAXLEN=4096 RUNS='128:64:1:2 128:64:8:1' SYNTH_DIR=/tmp/x.
# Every stage has a timeout and is skipped once $BUDGET seconds (default 250) have passed (the plain
# server's runs once half of what was left when it started has).
# Files back: $OUT/summary.txt, $OUT/logs.tgz (every log and JSON report), $OUT/env.txt.
# How: here `bash tools/device/make_dist.sh` (a CUDA build), then one `run` with carry
# ["build-cuda/dist"] and the command `bash tools/device/run_serve_s8.sh` (~4-5 minutes).
set -u
. tools/device/device_env.sh
T0=$SECONDS; BUDGET=${BUDGET:-250}
L=/tmp/s8logs; rm -rf $L; mkdir -p $L
left() { [ $((SECONDS - T0)) -lt "${2:-$BUDGET}" ] || { echo "(skipped: $1 at $((SECONDS - T0))s)"; return 1; }; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || nproc; } > $OUT/env.txt 2>&1
git log -1 --format='%H %s' >> $OUT/env.txt 2>/dev/null
cat $OUT/env.txt
S=${SYNTH_DIR:-/dev/shm/synth}; PRESET=${PRESET:-qwen3-8b}; DEV=${DEV:-cuda}  # PRESET=tiny DEV=cpu: a dry run
# MODEL_DIR / DRAFTER_DIR: serve these instead of the synthetic pair (e.g. models/stories260K and
# one of its shipped drafters on the CPU); nothing is synthesised then.
M="--model ${MODEL_DIR:-$S/$PRESET}"; DR="--drafter ${DRAFTER_DIR:-$S/$PRESET-dflash-b16-acc100}"
if [ -z "${DRAFTER_DIR:-}" ] && [ ! -e $S/$PRESET-dflash-b16-acc100 ]; then
  timeout 180 $B synth --preset $PRESET --out $S/$PRESET --drafter dflash-b16 --acceptance 100 > $L/synth.txt 2>&1
  echo "synth rc=$? ($((SECONDS - T0))s)"
fi
# prompt:output:clients:requests-per-client (RUNS and MAXLEN may be set for a dry run on the CPU)
RUNS=${RUNS:-128:256:1:2 128:256:8:2 128:256:32:2 128:256:128:2 2048:128:1:2 2048:128:32:1 8192:64:1:2 8192:64:8:1}
MAXLEN=${MAXLEN:-8448}
# The denominators' prompt length: the first run's (served 128-token prompts are compared with
# the engine generating after 128-token prompts, the same contexts, not bench's default 32).
BENCH_PROMPT=${BENCH_PROMPT:-${RUNS%%:*}}
# The engine's own figure first (the denominators): plain and speculative batched generation.
for n in ${BENCH_BATCHES:-1 8 32 128}; do
  left "bench batch $n" || break
  K=; [ $n -gt 1 ] && K=--kernels
  timeout 60 $B bench $M $DR --device $DEV --iters 3 --warmup 1 --context 384 --gen-tokens 256 \
    --prompt-tokens $BENCH_PROMPT $K --batch $n > $L/bench_b$n.txt 2>&1
  echo "-- bench --batch $n rc=$? ($((SECONDS - T0))s)"; grep -E "^generate|error|step from its ops" $L/bench_b$n.txt
done
PORT=18188
# SIGTERM, up to 15 s to stop, then SIGKILL.
stop_server() {
  kill $1 2>/dev/null
  for _ in $(seq 30); do kill -0 $1 2>/dev/null || break; sleep 0.5; done
  kill -9 $1 2>/dev/null; wait $1 2>/dev/null
}
# serve_runs MODE UNTIL SERVE-ARGS...: one server, bench-serve over the matrix (no run starts after
# UNTIL seconds), JSON per run.
serve_runs() {
  local mode=$1 until=$2; shift 2
  left "serve $mode" || return
  PORT=$((PORT + 1))  # a server that would not stop keeps its port; the next one takes another
  BLOCKSPEC_PROFILE_HOST=1 $B serve $M "$@" --device $DEV --port $PORT \
    --max-num-seqs 128 --max-model-len $MAXLEN > $L/serve_$mode.log 2>&1 &
  local pid=$! up=$SECONDS
  # Up: /health answers and a first request completes (at most 120 s; not after the server exited).
  until timeout 60 $B bench-serve --port $PORT --wait 1 --clients 1 --requests 1 --output-tokens 8 > $L/warm_$mode.txt 2>&1; do
    if ! kill -0 $pid 2>/dev/null || [ $((SECONDS - up)) -ge 120 ]; then
      echo "serve $mode: no answer ($((SECONDS - T0))s)"; tail -5 $L/serve_$mode.log
      stop_server $pid; return
    fi
  done
  # Warm-up: one request at 32 and 128 clients (plans, graphs, handler threads).
  for c in 32 128; do
    timeout 30 $B bench-serve --port $PORT --clients $c --requests $c --output-tokens 32 >> $L/warm_$mode.txt 2>&1
  done
  echo "serve $mode up and warm ($((SECONDS - T0))s)"
  # prompt:output:clients:requests-per-client
  for run in $RUNS; do
    IFS=: read -r p o c k <<< "$run"
    left "$mode p$p c$c" $until || break
    timeout 35 $B bench-serve --port $PORT --clients $c --requests $((c * k)) --prompt-tokens $p \
      --output-tokens $o --seed 1 --timeout 30 --json > $L/bs_${mode}_p${p}_c$c.json 2> $L/bs_${mode}_p${p}_c$c.err
    echo "-- $mode prompt $p clients $c rc=$? ($((SECONDS - T0))s)"
  done
  stop_server $pid  # SIGTERM: the server prints its last profile
}
serve_runs plain $(( (SECONDS - T0 + BUDGET) / 2 + 10 )) --no-drafter  # leaves the drafter its share
serve_runs spec $BUDGET $DR
python3 - $L $BENCH_PROMPT $RUNS > $OUT/summary.txt 2>&1 <<'EOF'
import json, os, re, sys
L, bench_prompt, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
bench, e2e = {}, {}
for n in (1, 8, 32, 128):
    try:
        t = open(f"{L}/bench_b{n}.txt").read()
    except OSError:
        continue
    for mode, key in (("plain", "plain"), ("spec", "speculative")):
        m = re.search(r"^generate \(" + key + r"(, batch \d+)?\): .*?-> ([\d.]+) tok/s", t, re.M)
        if m: bench[(mode, n)] = float(m.group(2))
        m = re.search(r"^generate \(" + key + r"(, batch \d+)?\): .*?([\d.]+) tok/s end to end", t, re.M)
        if m: e2e[(mode, n)] = float(m.group(2))
print("served (bench-serve, streaming, greedy, ignore_eos) vs the engine (bench --batch N generate,")
print(f"--prompt-tokens {bench_prompt}: {bench_prompt}-token prompts, 256 new tokens): bench tok/s")
print("excludes the prompts' prefill, bench e2e counts it (as a served request's duration does);")
print("decode tok/s = clients / mean TPOT")
hdr = ("mode", "prompt", "out", "cl", "req", "fail", "out tok/s", "req/s", "decode tok/s",
       "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "ITL p50/p90/p99 ms", "bench tok/s",
       "served/bench", "decode/bench", "bench e2e tok/s", "served/e2e")
print("| " + " | ".join(hdr) + " |"); print("|" + "---|" * len(hdr))
for mode in ("plain", "spec"):
    for p, o, c in (tuple(int(x) for x in r.split(":")[:3]) for r in runs):
        f = f"{L}/bs_{mode}_p{p}_c{c}.json"
        try:
            j = json.load(open(f))
        except Exception as e:
            print(f"| {mode} | {p} | {o} | {c} | no report ({os.path.basename(f)}) |"); continue
        q = lambda k: "{:.1f} / {:.1f} / {:.1f}".format(j[k]["p50"], j[k]["p90"], j[k]["p99"])
        dec = j.get("decode_tokens_per_s", 0.0)
        b = bench.get((mode, c))
        be = e2e.get((mode, c))
        ratio = lambda x, d=b: f"{100 * x / d:.0f} %" if d else "-"
        print(f"| {mode} | {p} | {o} | {c} | {j['requests']} | {j['failed']} | "
              f"{j['output_tokens_per_s']:.1f} | {j['request_throughput']:.2f} | {dec:.1f} | "
              f"{q('ttft_ms')} | {q('tpot_ms')} | {q('itl_ms')} | {b if b else '-'} | "
              f"{ratio(j['output_tokens_per_s'])} | {ratio(dec)} | {be if be else '-'} | "
              f"{ratio(j['output_tokens_per_s'], be)} |")
        if j.get("first_error"): print(f"|  first error: {j['first_error'][:150]} |")
print()
for n in (32, 128):  # bench --kernels --batch N: the batched decode step op by op
    try:
        for line in open(f"{L}/bench_b{n}.txt"):
            if line.startswith(("batch decode step", "kernels, batched", "  matmul [default]",
                                "  small ops", "  batched step")): print(f"b{n}", line.rstrip())
    except OSError:
        pass
print()
for mode in ("plain", "spec"):
    try:
        for line in open(f"{L}/serve_{mode}.log"):
            m = re.match(r"host profile: (\d+) steps", line)
            if m and int(m.group(1)) >= 30: print(mode, line.rstrip())
    except OSError:
        pass
EOF
cat $OUT/summary.txt
tar czf $OUT/logs.tgz -C $L . 2>/dev/null
echo "total $((SECONDS - T0))s"
