#!/usr/bin/env bash
# The idle read-back against the keepalive's interval (GPU machine, from the repository root):
# TANDEM_KEEPALIVE_MS 2 (the default), 0.5 and 0.2, CUDA and OpenCL, through one tandemd each,
# ROUNDS interleaved rounds. Shorter intervals reach the 1 and 5 ms gaps, which a 2 ms
# keepalive cannot; the 20 and 100 ms gaps stay about twice the warm latency whatever it is.
#   device tool: run(command="bash bench/experiments/keepalive_interval.sh", carry=[".deps"])
set -u
ROUNDS=${1:-3}
B=/tmp/keepalive-interval W=/tmp/keepalive-interval-work
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh
mkdir -p "$W"
cmake -S . -B "$B" -G Ninja -DTANDEM_WERROR=OFF >"$W/cfg.log" 2>&1 &&
  ninja -C "$B" tandemd tandem tandem_cudart tandem_opencl opencl_bench tandem_cuda_bench >"$W/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$W/build.log" "$W/cfg.log" | head -20; exit 1; }
vendors=$(native_opencl_vendors "$W") || exit 1
libs=$(icd_libs "$vendors")
export POCL_CACHE_DIR=$W/pocl TANDEM_FAILOVER_TIMEOUT_MS=600000
mkdir -p "$POCL_CACHE_DIR"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do stop_tandemd "$pid"; done
}
trap cleanup EXIT
declare -A addr
for backend in cuda opencl; do
  port=$(free_port)
  OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$B/server/tandemd" --listen 127.0.0.1:$port \
    --backend $backend >"$W/tandemd-$backend.log" 2>&1 &
  pids+=($!)
  addr[$backend]=127.0.0.1:$port
done
sleep 2
rows() { sed 's/ocl_readback_//;s/cuda_readback_//;s/idle_//' | awk '/readback|^warm|ms /{printf "%s %.1f  ", $1, $2}'; }
for round in $(seq "$ROUNDS"); do
  for ka in 2 0.5 0.2; do
    echo "== keepalive $ka ms, round $round, cuda:   $(TANDEM_KEEPALIVE_MS=$ka timeout 120 "$B/tools/tandem" run --servers "${addr[cuda]}" -- "$B/bench/cuda_bench" --idle 2>/dev/null | grep readback | rows)"
    echo "== keepalive $ka ms, round $round, opencl: $(TANDEM_KEEPALIVE_MS=$ka timeout 120 "$B/tools/tandem" run --servers "${addr[opencl]}" -- "$B/bench/opencl_bench" --idle 2>/dev/null | rows)"
  done
done
