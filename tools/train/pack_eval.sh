#!/bin/bash
# Runs here (the build machine), from the repo root: packs bench/eval_acceptance of a CUDA build
# (BUILD, default build) with the shared libraries the GPU machine's image lacks (everything ldd
# lists except glibc, the CUDA driver and cuBLASLt, as tools/device/make_dist.sh) into
# build-cuda/pack-train/eval_dist.tar.xz, for tools/train/run_device_s8.sh, which unpacks it into
# build-cuda/dist/ on the GPU machine (carry: ["build-cuda/pack-train"]).
#   bash tools/train/pack_eval.sh [BUILD=build]
set -eu -o pipefail
BUILD=${1:-build}
P=build-cuda/pack-train
[ -x "$BUILD/eval_acceptance" ] || {
  echo "missing $BUILD/eval_acceptance: cmake --build $BUILD --target eval_acceptance" >&2
  exit 1
}
ldd "$BUILD/eval_acceptance" | grep -q libcublasLt ||
  echo "warning: $BUILD/eval_acceptance is not a CUDA build (the CUDA figures will be missing)" >&2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/dist/lib" "$P"
cp "$BUILD/eval_acceptance" "$T/dist/"
strip "$T/dist/eval_acceptance"
ldd "$BUILD/eval_acceptance" | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcublasLt|libcuda)\.so' |
  while read -r l; do cp -L "$l" "$T/dist/lib/"; done
tar -C "$T" -cf - dist | xz -T0 -6 > "$P/eval_dist.tar.xz"
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
packed=$(du -cb "$P"/* | tail -1 | cut -f1)
ls -la "$P" | tail -n +2
echo "carry: $((packed / 1048576)) MiB packed + $((tracked / 1048576)) MiB tracked = $(((packed + tracked) / 1048576)) MiB of 64"
