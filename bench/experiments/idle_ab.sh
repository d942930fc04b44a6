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
N=/tmp/idle-ab-new B=/tmp/idle-ab-base S=/tmp/idle-ab-base-src W=/tmp/idle-ab-work
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh
T="tandemd tandem tandem_cudart tandem_opencl opencl_bench tandem_cuda_bench"
rm -rf "$S" "$W" && mkdir -p "$S" "$W" && tar -xf "$BASE_TAR" -C "$S" && cp -r .deps "$S/" 2>/dev/null
for tree in new base; do
  src=.; out=$N
  [[ $tree == base ]] && { src=$S; out=$B; }
  cmake -S "$src" -B "$out" -G Ninja -DTANDEM_WERROR=OFF >"$W/cfg-$tree.log" 2>&1 && ninja -C "$out" $T >"$W/build-$tree.log" 2>&1 ||
    { grep -E "error|FAILED" "$W/build-$tree.log" "$W/cfg-$tree.log" | head -20; exit 1; }
done
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
for tree in new base; do
  for backend in cuda opencl; do
    build=$N; [[ $tree == base ]] && build=$B
    port=$(free_port)
    OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$build/server/tandemd" --listen 127.0.0.1:$port \
      --backend $backend >"$W/tandemd-$tree-$backend.log" 2>&1 &
    pids+=($!)
    addr[$tree-$backend]=127.0.0.1:$port
  done
done
sleep 2
rows() { sed 's/ocl_readback_//;s/cuda_readback_//;s/idle_//' | awk '/readback|^warm|ms /{printf "%s %.1f  ", $1, $2}'; }
echo "== native opencl: $(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs "$N/bench/opencl_bench" --idle 2>/dev/null | rows)"
echo "== native cuda:   $("$N/bench/cuda_bench" --idle 2>/dev/null | grep readback | rows)"
for round in $(seq "$ROUNDS"); do
  for tree in base new; do
    build=$N; [[ $tree == base ]] && build=$B
    echo "== $tree $round opencl: $(timeout 120 "$build/tools/tandem" run --servers "${addr[$tree-opencl]}" -- "$build/bench/opencl_bench" --idle 2>/dev/null | rows)"
    echo "== $tree $round cuda:   $(timeout 120 "$build/tools/tandem" run --servers "${addr[$tree-cuda]}" -- "$build/bench/cuda_bench" --idle 2>/dev/null | grep readback | rows)"
  done
done
