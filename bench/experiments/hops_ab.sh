#!/usr/bin/env bash
# Synchronous round trips and idle read-backs through several builds in one lease (GPU
# machine, from the repository root): the working tree ("new") and each `git archive`
# tarball given (named after the file), one CUDA and one OpenCL tandemd each, then ROUNDS
# rounds in which every build in turn runs
#   loops: round_trip/sync_loop (synchronize alone, empty kernel + synchronize, 8 B read;
#          and per launch of 1000 asynchronous ones, p50 of 30)
#          and round_trip/ocl_loop (clFinish alone, kernel + clFinish, 8 B blocking read),
#          p50 of 3000 each;
#   idle:  cuda_bench --idle and opencl_bench --idle (keepalive on, its default);
# after native runs of the same (each round starts with the next build). BUILD=0 reuses the builds of a previous call (the machine
# must still be warm). E.g., behind the worker's and the client's thread hand-overs:
#   git archive bd67c61 -o .scratch/base.tar; git archive cc54ee2 -o .scratch/srv.tar
#   device tool: run(command="bash bench/experiments/hops_ab.sh 5 loops .scratch/base.tar .scratch/srv.tar", carry=[".deps", ".scratch"])
set -u
ROUNDS=${1:?usage: hops_ab.sh ROUNDS loops|idle|all TAR...}
WHAT=${2:?usage: hops_ab.sh ROUNDS loops|idle|all TAR...}
shift 2
here=bench/experiments/round_trip
source bench/experiments/lib.sh
P=/tmp/hops-ab W=$P-work
targets="tandemd tandem tandem_cudart tandem_opencl opencl_bench tandem_cuda_bench"
trees=(new)
for tar in "$@"; do trees+=("$(basename "$tar" .tar)"); done
if [[ ${BUILD:-1} != 0 ]]; then
  rm -rf "$W" && mkdir -p "$W" || exit 1
  build_tree . "$P-new" "$W" new "$targets" || exit 1
  for tar in "$@"; do
    t=$(basename "$tar" .tar)
    unpack_tree "$tar" "$P-$t-src" && build_tree "$P-$t-src" "$P-$t" "$W" "$t" "$targets" || exit 1
  done
  gcc -O2 -I.deps/include -o "$W/ocl_loop" $here/ocl_loop.c -lOpenCL &&
    nvcc -O2 -cudart shared -o "$W/sync_loop" $here/sync_loop.cu || exit 1
fi
experiment_env "$W"
declare -A addr
for t in "${trees[@]}"; do start_tree_servers "$t" "$P-$t"; done
sleep 2
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs
loops() {  # loops BUILD|native: the six loops' p50s on one line
  local m line="" cuda=() ocl=()
  if [[ $1 != native ]]; then
    cuda=("$1/tools/tandem" run --servers "${addr[$2-cuda]}" --)
    ocl=("$1/tools/tandem" run --servers "${addr[$2-opencl]}" --)
  fi
  for m in idle launch read async; do line+="cuda $(timeout 60 "${cuda[@]}" "$W/sync_loop" $m 2>/dev/null | sed 's/ p10.*//')  "; done
  for m in idle launch read; do line+="ocl $(timeout 60 "${ocl[@]}" "$W/ocl_loop" $m 2>/dev/null | sed 's/ p10.*//')  "; done
  echo "$line"
}
idle() {  # idle BUILD|native TREE: both APIs' idle read-back rows
  local pre=() api
  for api in opencl cuda; do
    [[ $1 != native ]] && pre=("$1/tools/tandem" run --servers "${addr[$2-$api]}" --)
    local bench=$P-new/bench/opencl_bench
    [[ $api == cuda ]] && bench=$P-new/bench/cuda_bench
    [[ $1 != native ]] && bench=${bench/$P-new/$1}
    echo -n "$api: $(timeout 120 "${pre[@]}" "$bench" --idle 2>/dev/null | idle_rows) "
  done
  echo
}
[[ $WHAT != idle ]] && echo "== native loops: $(loops native)"
[[ $WHAT != loops ]] && echo "== native idle: $(idle native)"
for round in $(seq "$ROUNDS"); do
  # Each round starts with the next build, so no build always runs first.
  for i in "${!trees[@]}"; do
    t=${trees[$(((i + round - 1) % ${#trees[@]}))]}
    [[ $WHAT != idle ]] && echo "== $t $round loops: $(loops "$P-$t" "$t")"
    [[ $WHAT != loops ]] && echo "== $t $round idle: $(idle "$P-$t" "$t")"
  done
done
