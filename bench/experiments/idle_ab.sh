#!/usr/bin/env bash
# The idle read-back, a base tree against the working tree, in one lease (GPU machine, from the
# repository root): one CUDA and one OpenCL tandemd of each build, then ROUNDS alternating runs
# of opencl_bench --idle and cuda_bench --idle through each (keepalive on, its default), after
# one native run of each. The base is a `git archive` tarball made before the run, e.g.
#   git archive 363de86 -o .scratch/base.tar
#   device tool: run(command="bash bench/experiments/idle_ab.sh .scratch/base.tar", carry=[".deps", ".scratch"])
# (behind 179d778: the OpenCL keepalive's wait on the waiter thread).
set -u
BASE_TAR=${1:?usage: idle_ab.sh BASE_TAR [ROUNDS]}
ROUNDS=${2:-4}
source bench/experiments/lib.sh
build_ab "$BASE_TAR" /tmp/idle-ab "tandemd tandem tandem_cudart tandem_opencl opencl_bench tandem_cuda_bench" || exit 1
experiment_env "$W"
declare -A addr
start_tree_servers new "$N"
start_tree_servers base "$B"
sleep 2
echo "== native opencl: $(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs "$N/bench/opencl_bench" --idle 2>/dev/null | idle_rows)"
echo "== native cuda:   $("$N/bench/cuda_bench" --idle 2>/dev/null | grep readback | idle_rows)"
for round in $(seq "$ROUNDS"); do
  for tree in base new; do
    build=$(ab_build $tree)
    echo "== $tree $round opencl: $(timeout 120 "$build/tools/tandem" run --servers "${addr[$tree-opencl]}" -- "$build/bench/opencl_bench" --idle 2>/dev/null | idle_rows)"
    echo "== $tree $round cuda:   $(timeout 120 "$build/tools/tandem" run --servers "${addr[$tree-cuda]}" -- "$build/bench/cuda_bench" --idle 2>/dev/null | grep readback | idle_rows)"
  done
done
