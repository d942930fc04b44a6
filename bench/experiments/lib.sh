# shellcheck shell=bash
# Sourced by the idle read-back experiments (idle_ab.sh, keepalive_interval.sh): tandemd
# servers on loopback that use this machine's own OpenCL (NVIDIA's on the GPU machine), and
# the rows of cuda_bench / opencl_bench --idle on one line.
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh

# experiment_env WORKDIR: the native OpenCL's vendors and libraries, a PoCL cache, and no
# lost-server verdict across the 100 ms gaps.
experiment_env() {
  vendors=$(native_opencl_vendors "$1") || exit 1
  libs=$(icd_libs "$vendors")
  export POCL_CACHE_DIR=$1/pocl TANDEM_FAILOVER_TIMEOUT_MS=600000
  mkdir -p "$POCL_CACHE_DIR"
  pids=()
  trap stop_experiment_servers EXIT
}

# start_experiment_server TANDEMD BACKEND LOG: one more tandemd; prints its address.
start_experiment_server() {
  local port
  port=$(free_port)
  OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$1" --listen 127.0.0.1:$port --backend "$2" >"$3" 2>&1 &
  pids+=($!)
  echo 127.0.0.1:$port
}

stop_experiment_servers() {
  local pid
  for pid in "${pids[@]}"; do stop_tandemd "$pid"; done
}

idle_rows() { sed 's/ocl_readback_//;s/cuda_readback_//;s/idle_//' | awk '/readback|^warm|ms /{printf "%s %.1f  ", $1, $2}'; }
