#!/usr/bin/env bash
# The 4-server advection's timeline: four OpenCL tandemd with the per-command trace and
# CLOCK_MONOTONIC times (TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1), then
# trace_4srv.py on their logs. From the repository root:
#   bash bench/experiments/opencl_4srv_trace.sh [BUILD_DIR] [ADVECTION ARGS...]
# (default --n 1024 --steps 40). Tracing slows every command a little; read the gaps.
# NO_BUILD=1: BUILD_DIR is built already (lib.sh four_advection_servers).
set -u
BLD=${1:-/tmp/tandem-procs}
shift
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(--n 1024 --steps 40)
source bench/experiments/lib.sh
export TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1
four_advection_servers "$BLD" trace
env -u TANDEM_TRACE -u TANDEM_LOG timeout 300 "$BLD/tools/tandem" run --servers "$four" -- \
  "$BLD/examples/opencl/advection" --devices 4 "${ARGS[@]}" --no-check 2>&1 | grep '^time: [0-9]'
sleep 1
for s in 1 2; do python3 bench/experiments/trace_4srv.py "$W"/trace-{0,1,2,3}.log --server $s; done
