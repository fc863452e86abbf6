# Sourced by the device scripts (run from the repo root on the GPU machine): the carried binaries
# in build-cuda/dist, their libraries and cuBLASLt on the library path, /work/main pointing at
# this tree (tests find their data there), and B = the blockspec binary.
D=build-cuda/dist
export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
L=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
[ -n "$L" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$L")
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
cp $D/blockspec build-cuda/blockspec
B=build-cuda/blockspec
