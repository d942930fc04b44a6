#!/usr/bin/env bash
# OpenCL's synchronous round trips with the wait in place (the default) against
# TANDEM_WAIT_IN_PLACE=0 (every wait on the server's waiter thread), one build, one tandemd,
# one lease (GPU machine, from the repository root):
#   bash bench/experiments/wait_in_place_ab.sh [ROUNDS] [N]    (BUILD_DIR=dir: use that build)
# Each round runs round_trip/ocl_loop idle|launch|read (N round trips each, p50) through Tandem
# both ways, the order of the two swapped every round; native runs before and after the rounds.
# A run that fails shows as FAILED.
set -u
ROUNDS=${1:-5}
N=${2:-3000}
here=bench/experiments/round_trip
source bench/experiments/lib.sh
P=${BUILD_DIR:-/tmp/wip-ab} W=/tmp/wip-ab-work
rm -rf "$W" && mkdir -p "$W" || exit 1
if [[ -z ${BUILD_DIR:-} ]]; then
  timeout 400 bash -c "source bench/experiments/lib.sh; build_tree . '$P' '$W' new 'tandemd tandem tandem_opencl' \
    -DTANDEM_CUDA_PROGRAMS=OFF" || { echo "build failed"; exit 1; }
fi
gcc -O2 -I.deps/include -o "$W/ocl_loop" $here/ocl_loop.c -lOpenCL || exit 1
experiment_env "$W"
# Not $(...): the server must stay this shell's child, for experiment_env's cleanup to stop it.
start_experiment_server "$P/server/tandemd" opencl "$W/tandemd.log" >"$W/addr" || exit 1
server=$(cat "$W/addr")
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs
loops() {  # loops native|1|0: the three loops' p50s on one line
  local m out line="" pre=()
  [[ $1 != native ]] && pre=(env TANDEM_WAIT_IN_PLACE="$1" "$P/tools/tandem" run --servers "$server" --)
  for m in idle launch read; do
    out=$(timeout 60 "${pre[@]}" "$W/ocl_loop" $m "$N" 2>"$W/last.log") || out="$m: FAILED ($(tail -1 "$W/last.log"))"
    line+="$(sed 's/ p10.*//' <<<"$out")  "
  done
  echo "$line"
}
echo "== native: $(loops native)"
for round in $(seq "$ROUNDS"); do
  order=(1 0)
  ((round % 2 == 0)) && order=(0 1)
  for v in "${order[@]}"; do echo "== in place $v, round $round: $(loops "$v")"; done
done
echo "== native: $(loops native)"
