#!/usr/bin/env bash
# The 4-server advection's timeline: four OpenCL tandemd with the per-command trace and
# CLOCK_MONOTONIC times (TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1), then
# trace_4srv.py on their logs. From the repository root:
#   bash bench/experiments/opencl_4srv_trace.sh [BUILD_DIR] [ADVECTION ARGS...]
# (default --n 1024 --steps 40). Tracing slows every command a little; read the gaps.
set -u
BLD=${1:-/tmp/tandem-procs}
shift
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(--n 1024 --steps 40)
source bench/experiments/lib.sh
W=$BLD-work
mkdir -p "$W"
if [[ ! -x $BLD/server/tandemd ]]; then
  build_tree . "$BLD" "$W" procs "tandemd tandem tandem_opencl advection" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
fi
experiment_env "$W"
export TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1
declare -A addr
for i in 0 1 2 3; do start_server_as "s$i" "$BLD/server/tandemd" opencl "$W/trace-$i.log"; done
sleep 2
four=${addr[s0]},${addr[s1]},${addr[s2]},${addr[s3]}
env -u TANDEM_TRACE -u TANDEM_LOG timeout 300 "$BLD/tools/tandem" run --servers "$four" -- \
  "$BLD/examples/opencl/advection" --devices 4 "${ARGS[@]}" --no-check 2>&1 | grep '^time: [0-9]'
sleep 1
for s in 1 2; do python3 bench/experiments/trace_4srv.py "$W"/trace-{0,1,2,3}.log --server $s; done
