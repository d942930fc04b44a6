# Sourced by the GPU benchmarks that put several tandemd on ONE GPU in place of several GPUs.
# Without NVIDIA's Multi-Process Service the driver time-slices the servers' contexts, so two
# servers' kernels never overlap as they would on two GPUs (REMD with two replicas on the one
# H100: 2.14x the time of one). MPS is a user-space daemon; it changes no GPU setting, and
# mps_stop ends it. CUDA only: NVIDIA's OpenCL cannot create a context under MPS
# (clCreateContext returns -9999), so OpenCL servers and programs never get MPS_ENV.

MPS_ENV="" MPS_DIR=""

# mps_start: starts a control daemon with private pipe and log folders and sets MPS_ENV to the
# assignments that put a CUDA process on it (`env $MPS_ENV prog`). Fails, MPS_ENV empty, when
# MPS is not available here.
mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || return 1
  MPS_DIR=$(mktemp -d /tmp/tandem-mps.XXXXXX) || return 1
  mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
  if CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log nvidia-cuda-mps-control -d; then
    MPS_ENV="CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log"
    return 0
  fi
  rm -rf "$MPS_DIR"
  MPS_DIR=""
  return 1
}

# mps_stop: ends the daemon mps_start started (after the processes that use it); quiet.
mps_stop() {
  [[ -n $MPS_ENV ]] || return 0
  # shellcheck disable=SC2086
  echo quit | env $MPS_ENV nvidia-cuda-mps-control >/dev/null 2>&1
  for _ in $(seq 1 20); do pgrep -f nvidia-cuda-mps-server >/dev/null || break; sleep 0.1; done
  rm -rf "$MPS_DIR"
  MPS_ENV="" MPS_DIR=""
}
