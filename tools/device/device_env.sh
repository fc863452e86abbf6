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
# The build tree's source folder (make_dist.sh wrote it): tests that name their data by the
# build's absolute source path find it through a link to this tree.
SRC=$(cat $D/source_dir.txt 2>/dev/null)
[ -n "$SRC" ] && [ ! -e "$SRC" ] && mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"
# One line about the machine, for the top of a session's log.
print_machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  echo "$(nproc) cores; commit $(git log -1 --format='%h %s' 2>/dev/null)"
}
# A session script's start: its output also into LOG (the file that comes back), then the machine.
start_session() {
  exec > >(tee -a "$1") 2>&1
  print_machine
}
# The synthetic Qwen3-8B target and its forced-100 % DFlash-b16 drafter, written in the background
# into S (/dev/shm/synth: $S/qwen3-8b, $S/qwen3-8b-dflash-b16-acc100) while the caller runs its
# tests; its log into $1. `wait $SYNTH_PID` before using them.
S=/dev/shm/synth
start_synth() {
  if [ -e $S/qwen3-8b-dflash-b16-acc100/config.json ] && [ -e $S/qwen3-8b/config.json ]; then
    echo "synth: kept from an earlier call" > "$1"; true & SYNTH_PID=$!; return
  fi
  timeout 200 $B synth --preset qwen3-8b --out $S/qwen3-8b --drafter dflash-b16 --acceptance 100 \
    > "$1" 2>&1 &
  SYNTH_PID=$!
}
