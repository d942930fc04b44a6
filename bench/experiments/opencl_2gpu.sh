#!/usr/bin/env bash
# The advection on the 2-GPU machine, where each tandemd can have a GPU of its own (no time
# slicing between servers): natively (one process with a queue per band, the bands round-robin
# over both GPUs; and one process per band) and through one tandemd per GPU (2 bands) or two
# per GPU (4 bands), ms/step, ROUNDS alternating rounds; then the 2-server chain's trace
# (trace_4srv.py, n = 1024). From the repository root:
#   bash bench/experiments/opencl_2gpu.sh [ROUNDS] [BUILD_DIR]
set -u
ROUNDS=${1:-2}
BLD=${2:-/tmp/tandem-2gpu}
source bench/experiments/lib.sh
W=$BLD-work
mkdir -p "$W"
build_tree . "$BLD" "$W" two "tandemd tandem tandem_opencl advection advection_procs" -DTANDEM_CUDA_PROGRAMS=OFF ||
  exit 1
experiment_env "$W"
nvidia-smi -L
# server NAME GPU [ENV...]: one tandemd serving only GPU's OpenCL device; address in addr[NAME].
declare -A addr
server() {
  local name=$1 gpu=$2 port
  shift 2
  port=$(free_port)
  env "$@" OCL_ICD_VENDORS="$vendors" OCL_ICD_FILENAMES="$libs" setsid "$BLD/server/tandemd" --listen 127.0.0.1:$port \
    --backend opencl --devices "$gpu" >"$W/td-$name.log" 2>&1 &
  pids+=($!)
  addr[$name]=127.0.0.1:$port
}
server a0 0 X=1; server a1 1 X=1; server b0 0 X=1; server b1 1 X=1
server t0 0 TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1
server t1 1 TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1
sleep 2
ADV=$BLD/examples/opencl/advection
ms() { sed -n 's/^time: .*(\([0-9.]*\) ms\/step).*/\1/p'; }
nat() { OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 300 "$@" | ms; }
tan() { timeout 300 "$BLD/tools/tandem" run --servers "$1" -- "${@:2}" 2>&1 | ms; }
two=${addr[a0]},${addr[a1]}
four=${addr[a0]},${addr[b0]},${addr[a1]},${addr[b1]}  # bands 0,1 on GPU 0; 2,3 on GPU 1
for size in "--n 1024 --steps 200" "--n 8192 --steps 100" "--n 16384 --steps 50"; do
  echo "== advection $size, ms/step"
  for ((r = 1; r <= ROUNDS; ++r)); do
    # shellcheck disable=SC2086
    echo "  2 bands: native 1 process $(nat "$ADV" --devices 2 $size --no-check), 2 processes" \
      "$(nat "$BLD/bench/advection_procs" --procs 2 $size), 2 tandemd $(tan "$two" "$ADV" --devices 2 $size --no-check)" \
      "| 4 bands: native 1 process $(nat "$ADV" --devices 4 $size --no-check), 4 processes" \
      "$(nat "$BLD/bench/advection_procs" --procs 4 $size), 4 tandemd $(tan "$four" "$ADV" --devices 4 $size --no-check)"
  done
done
echo "== the 2-server chain, n = 1024, traced: $(tan "${addr[t0]},${addr[t1]}" "$ADV" --devices 2 --n 1024 --steps 60 --no-check) ms/step"
python3 bench/experiments/trace_4srv.py "$W/td-t0.log" "$W/td-t1.log" --server 1 | tail -4
