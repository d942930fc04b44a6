#!/usr/bin/env bash
# OpenCL synchronous round trips, a base tree against the working tree, in one lease (GPU
# machine, from the repository root): one OpenCL tandemd of each build, then ROUNDS
# alternating runs of round_trip/ocl_loop (clFinish alone, an empty kernel + clFinish, a
# blocking 8-byte read; p50 of 3000 each) through each, after native runs of the same and of
# round_trip/ocl_sync_paths (how a wait split over two threads costs natively). The base is a
# `git archive` tarball made before the run, e.g.
#   git archive a50668a -o .scratch/base.tar
#   device tool: run(command="bash bench/experiments/opencl_flush_ab.sh .scratch/base.tar", carry=[".deps", ".scratch"])
# (behind the flush a deferred OpenCL wait leaves to itself when it runs next).
set -u
BASE_TAR=${1:?usage: opencl_flush_ab.sh BASE_TAR [ROUNDS]}
ROUNDS=${2:-6}
here=bench/experiments/round_trip
source bench/experiments/lib.sh
build_ab "$BASE_TAR" /tmp/flush-ab "tandemd tandem tandem_opencl" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
gcc -O2 -I.deps/include -o "$W/ocl_loop" $here/ocl_loop.c -lOpenCL &&
  gcc -O2 -I.deps/include -o "$W/ocl_sync_paths" $here/ocl_sync_paths.c -lOpenCL -lpthread || exit 1
experiment_env "$W"
declare -A addr
start_ab_servers opencl
sleep 2
loops() {  # loops [TANDEM RUN PREFIX...]: the three loops' p50s on one line
  local m line=""
  for m in idle launch read; do line+="$(timeout 60 "$@" "$W/ocl_loop" $m 2>/dev/null | sed 's/ p10.*//')  "; done
  echo "$line"
}
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs
"$W/ocl_sync_paths" 3000 3 | sed 's/^/== native sync paths: /'
echo "== native: $(loops)"
for round in $(seq "$ROUNDS"); do
  for tree in base new; do
    echo "== $tree $round: $(loops "$(ab_build $tree)/tools/tandem" run --servers "${addr[$tree]}" --)"
  done
done
