#!/usr/bin/env bash
# A/B of the session's holding (TANDEM_SERVER_HOLD: commands that wait on another server stay
# in tandemd until it answers, instead of waiting in the OpenCL queue behind a user event) on
# the 4-device workloads: four OpenCL tandemd with it off and four with it on, in alternating
# rounds. From the repository root:
#   bash bench/experiments/opencl_hold_ab.sh [ROUNDS] [BUILD_DIR]   (NO_BUILD=1: built already)
# Prints ms/step (advection) or seconds (multi_matmul) and the result line's digest per round;
# digests must agree within a row. SIZES (env): advection arguments, ';'-separated.
set -u
ROUNDS=${1:-3}
BLD=${2:-/tmp/tandem-procs}
source bench/experiments/lib.sh
export TANDEM_SERVER_HOLD=0
four_advection_servers "$BLD" hold0
off=$four
[[ ${NO_BUILD:-0} == 1 ]] || build_tree . "$BLD" "$W" matmul multi_matmul -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
export TANDEM_SERVER_HOLD=1
for i in 0 1 2 3; do start_server_as "on$i" "$BLD/server/tandemd" opencl "$W/hold1-$i.log"; done
on=${addr[on0]},${addr[on1]},${addr[on2]},${addr[on3]}
sleep 2
run() {  # run SERVERS PROGRAM ARGS...: "time digest"
  local servers=$1 prog=$2
  shift 2
  run_summary "$(timeout 300 "$BLD/tools/tandem" run --servers "$servers" -- "$BLD/examples/opencl/$prog" --devices 4 \
    "$@" 2>&1)"
}
workload_rows
for row in "${rows[@]}"; do
  echo "== $row, four servers, $ROUNDS rounds"
  a="" b=""
  for ((r = 1; r <= ROUNDS; ++r)); do
    # shellcheck disable=SC2086 # row is a list of arguments
    a+="$(run "$off" $row) | "
    # shellcheck disable=SC2086
    b+="$(run "$on" $row) | "
  done
  echo "hold off: $a"
  echo "hold on:  $b"
done
