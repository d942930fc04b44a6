#!/usr/bin/env bash
# Where the 4-server advection's step goes on the device: four OpenCL tandemd with
# TANDEM_TRACE_CL_TIMES=1 log the profiling times of every kernel, server-to-server read and
# gated copy, and cl_times.py sums them up per server. The question it answers: is a halo's
# source read held on the host until the kernel before it ends (submit after the kernel's
# end), or submitted at once and waiting on the device (start long after submit)? From the
# repository root:
#   bash bench/experiments/opencl_cl_times.sh [BUILD_DIR]     (NO_BUILD=1: built already)
# SIZES (env): the advection arguments of each run, ';'-separated. ALIGN=1 (env): the
# per-command trace with CLOCK_MONOTONIC times too, and cl_align.py's cross-server legs
# (tracing slows every command a little).
set -u
BLD=${1:-/tmp/tandem-procs}
source bench/experiments/lib.sh
export TANDEM_LOG=info TANDEM_TRACE_CL_TIMES=1
[[ ${ALIGN:-0} == 1 ]] && export TANDEM_TRACE=1 TANDEM_LOG_TIME=1
four_advection_servers "$BLD" cltimes
SIZES=${SIZES:-"--n 1024 --steps 100;--n 8192 --steps 50"}
IFS=';' read -r -a sizes <<<"$SIZES"
for size in "${sizes[@]}"; do
  declare -A mark=()
  for i in 0 1 2 3; do mark[$i]=$(wc -l <"$W/cltimes-$i.log"); done
  echo "== advection $size through four servers"
  # shellcheck disable=SC2086 # size is a list of arguments
  env -u TANDEM_LOG -u TANDEM_TRACE timeout 300 "$BLD/tools/tandem" run --servers "$four" -- \
    "$BLD/examples/opencl/advection" --devices 4 $size --no-check 2>&1 | grep '^time: [0-9]'
  sleep 1
  tag=$(tr -dc '0-9a-z' <<<"$size")
  for i in 0 1 2 3; do tail -n +$((mark[$i] + 1)) "$W/cltimes-$i.log" >"$W/cl-$tag-$i.log"; done
  python3 bench/experiments/cl_times.py "$W"/cl-"$tag"-{0,1,2,3}.log
  [[ ${ALIGN:-0} == 1 ]] && python3 bench/experiments/cl_align.py "$W"/cl-"$tag"-{0,1,2,3}.log
done
