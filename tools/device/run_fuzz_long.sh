#!/bin/bash
# Runs on the GPU machine (16 cores) from the repo root: the long libFuzzer run of issue 18
# (docs/RELIABILITY.md, "Fuzzing"): every harness of tests/fuzz with W parallel workers, each
# `-runs=TARGET/W` under a wall-time cap, sharing one working corpus directory per harness (each
# worker writes what it finds there and reloads the others' finds, libFuzzer's -reload).
#
#   bash tools/device/run_fuzz_long.sh [CAP_SECONDS] [TARGET_PER_HARNESS]    (default 480, 10^7)
#
# Binaries: build-fuzz-dist/ unpacked from the carried build-cuda/pack/fuzz.tar.xz (pack_session8.sh:
# the clang -fsanitize=fuzzer,address,undefined harnesses, debug info stripped, the sanitizer
# runtimes are linked in; libfmt / libstdc++ / libgcc_s in lib/; the grown corpus of earlier runs).
# CORES (default: all but 2, left to GPU work running alongside) worker processes in all, split
# over the harnesses in proportion to WEIGHTS (the slower harnesses get more), at nice NICE (10),
# so that the GPU work beside them gets a core whenever it needs more than the 2.
# Into $OUT: fuzz_summary.txt (executions per harness summed over its workers from the final
# stat::number_of_executed_units lines, or the last "#N" status line of a worker that stopped on
# a finding; exec/s; findings) and fuzz_corpus.tar.xz (the grown corpora, the findings'
# inputs and every worker's log tail). Reports carry module+offset frames (no symbolizer on that
# machine): symbolize them here with the unstripped build-fuzz binaries of the same build.
set -u
OUT=${OUT:-/tmp/fuzz_out}
mkdir -p "$OUT"
CAP=${1:-480}
TARGET=${2:-10000000}
F=${FUZZ_DIST:-build-fuzz-dist}
if [ ! -d $F ]; then
  mkdir -p $F && tar -xJf build-cuda/pack/fuzz.tar.xz -C $F || { echo "fuzz: no $F and no build-cuda/pack/fuzz.tar.xz"; exit 1; }
fi
export LD_LIBRARY_PATH=$PWD/$F/lib:${LD_LIBRARY_PATH:-}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:symbolize=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:symbolize=0}
CORES=${CORES:-$(($(nproc) - 2))}
((CORES < 7)) && CORES=7
# Relative cost per execution (the dev machine's exec/s, docs/RELIABILITY.md): workers follow it.
WEIGHTS=${WEIGHTS:-"safetensors:1 hf_config:2 tokenizer_json:3 tokenizer_encode:4 jinja_template:3 chat_render:1 openai_request:3"}
W=/tmp/fuzzlong
rm -rf $W && mkdir -p $W
total_weight=0
for hw in $WEIGHTS; do total_weight=$((total_weight + ${hw#*:})); done
declare -A workers
given=0
for hw in $WEIGHTS; do
  h=${hw%%:*}; w=${hw#*:}
  workers[$h]=$((CORES * w / total_weight)); ((workers[$h] < 1)) && workers[$h]=1
  given=$((given + workers[$h]))
done
# Cores left by the rounding go to the heaviest harnesses first, one each, round after round.
for w in 4 3 2 1 4 3 2 1 4 3 2 1; do
  for hw in $WEIGHTS; do
    ((given >= CORES)) && break 2
    h=${hw%%:*}; [ ${hw#*:} = $w ] && workers[$h]=$((workers[$h] + 1)) && given=$((given + 1))
  done
done
echo "fuzz: $CORES workers over 7 harnesses, cap ${CAP} s, target $TARGET executions each"
T0=$SECONDS
for hw in $WEIGHTS; do
  h=${hw%%:*}; n=${workers[$h]}
  mkdir -p $W/corpus/$h $W/artifacts/$h
  [ -d $F/corpus/$h ] && cp -r $F/corpus/$h/. $W/corpus/$h/
  for ((k = 0; k < n; ++k)); do
    # Worker k: its share of the target (the first ones take the remainder), its own seed.
    runs=$((TARGET / n + (k < TARGET % n ? 1 : 0)))
    nice -n ${NICE:-10} $F/${h}_fuzz $W/corpus/$h tests/fuzz/corpus/$h -runs=$runs -max_total_time=$CAP \
      -seed=$((1000 * k + 7)) -timeout=20 -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 \
      -reload=10 -artifact_prefix=$W/artifacts/$h/ > $W/${h}_$k.log 2>&1 &
  done
  echo "  $h: $n workers"
done
wait
wall=$((SECONDS - T0))
# executions of one worker log: the final stats line, else the last "#N" status line.
execs_of() {
  local n=$(grep -m1 '^stat::number_of_executed_units' "$1" | awk '{print $2}')
  [ -z "$n" ] && n=$(grep -oE '^#[0-9]+' "$1" | tail -1 | tr -d '#')
  echo "${n:-0}"
}
S=$OUT/fuzz_summary.txt
{
  echo "fuzz long run: $(date -u +%FT%TZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $CORES workers, cap ${CAP} s, target $TARGET, wall ${wall} s"
  printf "%-17s %8s %13s %10s %9s %s\n" harness workers executions exec/s corpus findings
  all_ok=1
  for hw in $WEIGHTS; do
    h=${hw%%:*}; sum=0; findings=0; secs=0
    for log in $W/${h}_*.log; do
      sum=$((sum + $(execs_of $log)))
      grep -qE "^==[0-9]+==ERROR|runtime error|deadly signal|Test unit written|ERROR: libFuzzer" $log && findings=$((findings + 1))
      s=$(grep -oE '^Done [0-9]+ runs in [0-9]+ second' $log | awk '{print $5}'); [ -n "$s" ] && ((s > secs)) && secs=$s
    done
    ((secs == 0)) && secs=$wall
    ((findings > 0 || sum < TARGET)) && all_ok=0
    printf "%-17s %8d %13d %10d %9d %d%s\n" $h ${workers[$h]} $sum $((sum / (secs > 0 ? secs : 1))) \
      $(ls $W/corpus/$h | wc -l) $findings "$(ls $W/artifacts/$h | head -3 | tr '\n' ' ')"
  done
  echo "verdict: $([ $all_ok = 1 ] && echo "every harness reached $TARGET executions with no finding" || echo "NOT every harness reached $TARGET without a finding (see above)")"
} | tee $S
# The corpora, the findings and every worker's log tail, as one file.
for log in $W/*.log; do tail -n 40 $log > $log.tail; done
tar -C $W -cJf $OUT/fuzz_corpus.tar.xz corpus artifacts $(cd $W && ls *.tail)
ls -la $OUT/fuzz_corpus.tar.xz | awk '{print "fuzz_corpus.tar.xz: " $5 " bytes"}' | tee -a $S
