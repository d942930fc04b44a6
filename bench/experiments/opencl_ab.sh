#!/usr/bin/env bash
# A/B of two builds on the 4-device OpenCL workloads through four tandemd each (on one GPU:
# four processes time-slicing it), alternating rounds, with four native processes
# (advection_procs --procs 4, halos through host shared memory) in each advection round for
# scale. From the repository root:
#   git archive -o /tmp/base.tar BASE_COMMIT
#   bash bench/experiments/opencl_ab.sh /tmp/base.tar [ROUNDS] [PREFIX] [LOG]
# Builds the working tree into PREFIX-new and the tarball into PREFIX-base (lib.sh build_ab).
# Prints ms/step (advection) or seconds (multi_matmul) and the result lines' digest per round;
# digests must agree within a row. SIZES (env): advection arguments, ';'-separated. Lines go
# to LOG as they come (default /dev/stdout).
set -u
TAR=$1
ROUNDS=${2:-3}
PREFIX=${3:-/tmp/tandem-oab}
LOG=${4:-/dev/stdout}
say() { echo "$*" >>"$LOG"; }
source bench/experiments/lib.sh
targets="tandemd tandem tandem_opencl advection multi_matmul advection_procs"
build_ab "$TAR" "$PREFIX" "$targets" -DTANDEM_CUDA_PROGRAMS=OFF || { say "build failed"; exit 1; }
say "built base and new"
experiment_env "$W"
declare -A addr
for tree in base new; do
  for i in 0 1 2 3; do start_server_as "$tree$i" "$(ab_build $tree)/server/tandemd" opencl "$W/$tree-$i.log"; done
done
sleep 2
run() {  # run base|new PROGRAM ARGS...: "time digest"
  local tree=$1 prog=$2 bld
  shift 2
  bld=$(ab_build "$tree")
  run_summary "$(timeout 120 "$bld/tools/tandem" run \
    --servers "${addr[${tree}0]},${addr[${tree}1]},${addr[${tree}2]},${addr[${tree}3]}" -- \
    "$bld/examples/opencl/$prog" --devices 4 "$@" 2>&1)"
}
procs() {  # procs ADVECTION ARGS...: four native processes, "time digest"
  run_summary "$(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 120 "$N/bench/advection_procs" --procs 4 \
    "$@" 2>&1)"
}
workload_rows
for row in "${rows[@]}"; do
  a="" b="" p=""
  for ((r = 1; r <= ROUNDS; ++r)); do
    # shellcheck disable=SC2086 # row is a list of arguments
    a+="$(run base $row) | "
    # shellcheck disable=SC2086
    b+="$(run new $row) | "
    # shellcheck disable=SC2086
    [[ $row == advection* ]] && p+="$(procs ${row#advection }) | "
  done
  say "== $row, four servers, $ROUNDS rounds"
  say "base: $a"
  say "new:  $b"
  [[ -n $p ]] && say "native, 4 processes: $p"
done
