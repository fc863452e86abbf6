#!/bin/bash
# Runs here (the build machine), from the repo root: packs what tools/device/run_session8.sh needs
# into build-cuda/pack/ (carry: ["build-cuda/pack"]):
#   dist.tar.xz - make_dist.sh's build-cuda/dist from BUILD (CUDA build: blockspec, cuda_ops_test,
#                 server_load_test and their libraries; cuda_models_test and bench_cli_test are
#                 left out, session 8 does not run them);
#   fuzz.tar.xz - the 7 libFuzzer harnesses of FUZZ_BUILD (scripts/fuzz.sh's clang build; the
#                 sanitizer runtimes are linked in statically, so they need only libfmt, libstdc++
#                 and libgcc_s beside glibc), debug info stripped (symbol tables kept: reports name
#                 functions; the unstripped FUZZ_BUILD binaries symbolize the module+offset frames
#                 here), and FUZZ_BUILD/corpus, the corpus grown by earlier runs;
#   kprof/      - tools/kprof/kprof.cc built against this machine's CUPTI, with libcupti.so.13
#                 (docs/CUDA.md: per-kernel GPU times without Nsight Systems).
#   [OLD=baseline-blockspec] bash tools/device/pack_session8.sh [BUILD=build] [FUZZ_BUILD=build-fuzz|-]
set -eu
BUILD=${1:-build}
FUZZ_BUILD=${2:-build-fuzz}
P=build-cuda/pack
mkdir -p $P
for t in e2e_server_load_test cuda_cuda_ops_test; do
  [ -x $BUILD/tests/$t ] || { echo "missing $BUILD/tests/$t: cmake --build $BUILD --target $t"; exit 1; }
done
bash tools/device/make_dist.sh "$BUILD" > /dev/null
# OLD=path: a baseline binary (another commit's blockspec) as dist/blockspec_old, for A/B calls.
[ -n "${OLD:-}" ] && cp "$OLD" build-cuda/dist/blockspec_old
# FULL=1 keeps them (run_session8b.sh runs every CUDA suite and the training's eval_acceptance).
[ "${FULL:-0}" = 1 ] || rm -f build-cuda/dist/cuda_models_test build-cuda/dist/bench_cli_test build-cuda/dist/eval_acceptance
tar -C build-cuda -cf - dist | xz -T0 -6 > $P/dist.tar.xz
# FUZZ_BUILD=- skips the fuzz pack (calls that run no fuzzing).
if [ "$FUZZ_BUILD" != - ]; then
  F=$(mktemp -d)
  for h in safetensors hf_config tokenizer_json tokenizer_encode jinja_template chat_render openai_request; do
    [ -x $FUZZ_BUILD/tests/fuzz/${h}_fuzz ] || { echo "missing $FUZZ_BUILD/tests/fuzz/${h}_fuzz: bash scripts/fuzz.sh 1"; exit 1; }
    cp $FUZZ_BUILD/tests/fuzz/${h}_fuzz $F/
  done
  strip --strip-debug $F/*_fuzz
  mkdir -p $F/lib
  ldd $F/*_fuzz | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' | while read -r l; do cp -L "$l" $F/lib/; done
  [ -d $FUZZ_BUILD/corpus ] && cp -r $FUZZ_BUILD/corpus $F/corpus
  tar -C $F -cf - . | xz -T0 -6 > $P/fuzz.tar.xz
  rm -rf $F
fi
# kprof (tools/kprof/kprof.cc) and the CUPTI it needs, when this machine has CUPTI.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUPTI=$(ls $CUDA_HOME/lib/libcupti.so.13 $CUDA_HOME/lib64/libcupti.so.13 $CUDA_HOME/extras/CUPTI/lib64/libcupti.so.13 2>/dev/null | head -1)
if [ -n "$CUPTI" ]; then
  mkdir -p $P/kprof
  g++ -O2 -std=c++17 -shared -fPIC tools/kprof/kprof.cc -I$CUDA_HOME/include -L"$(dirname "$CUPTI")" \
    -lcupti -o $P/kprof/kprof.so && cp -L "$CUPTI" $P/kprof/ && strip $P/kprof/*.so*
fi
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
packed=$(du -cb $P | tail -1 | cut -f1)
ls -la $P | tail -n +2
echo "carry: $((packed / 1048576)) MiB packed + $((tracked / 1048576)) MiB tracked = $(((packed + tracked) / 1048576)) MiB of 64"
