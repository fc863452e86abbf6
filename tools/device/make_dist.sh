#!/bin/bash
# Runs here (the build machine): copies the binaries the device scripts use from BUILD (default
# build) into build-cuda/dist, stripped, with the shared libraries the GPU machine's image lacks
# in dist/lib (everything ldd lists except glibc, the CUDA driver and cuBLASLt). Carry
# build-cuda/dist to the device (`run` with carry: ["build-cuda/dist"]).
set -eu
BUILD=${1:-build}
D=build-cuda/dist
rm -rf $D && mkdir -p $D/lib
cp $BUILD/blockspec $D/
for t in cuda_ops_test cuda_models_test bench_cli_test; do
  [ -e $BUILD/tests/cuda_$t ] && cp $BUILD/tests/cuda_$t $D/$t
done
[ -e $BUILD/eval_acceptance ] && cp $BUILD/eval_acceptance $D/
# The load driver of issue 18 (run_gpu_load.sh): tests/e2e/server_load_test.cc.
[ -e $BUILD/tests/e2e_server_load_test ] && cp $BUILD/tests/e2e_server_load_test $D/server_load_test
strip $D/* 2>/dev/null || true
# The test binaries find their data under the source path they were built from: recorded here
# so that the device scripts can link it to the tree they run in.
grep -m1 '^CMAKE_HOME_DIRECTORY' $BUILD/CMakeCache.txt | cut -d= -f2 > $D/source_dir.txt
for b in $D/*; do [ -f "$b" ] && ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcublasLt|libcuda)\.so' |
  while read -r l; do cp -L "$l" $D/lib/; done
du -sh $D; ls $D $D/lib
