#!/usr/bin/env bash
# Where CUDA's asynchronous launch rate goes through Tandem (GPU machine, from the repository
# root): launch_burst (30 bursts of 1000 empty-kernel launches, each then synchronized) three
# times natively and three times through one CUDA tandemd with TANDEM_SERVER_PROFILE=1, then
# the worker's profile: its time per Launch and per request batch.
#   device tool: run(command="bash bench/experiments/round_trip/launch_burst.sh", carry=[".deps"])
# With a base tree (a `git archive` tarball), no profile: ROUNDS rounds in which the base and
# the working tree, one tandemd each, run it in turn.
#   run(command="bash bench/experiments/round_trip/launch_burst.sh .scratch/base.tar 8", carry=[".deps", ".scratch"])
set -u
BASE_TAR=${1:-} ROUNDS=${2:-6}
source bench/experiments/lib.sh
targets="tandemd tandem tandem_cudart"
if [[ -z $BASE_TAR ]]; then
  N=/tmp/burst-new W=/tmp/burst-work
  rm -rf "$W" && mkdir -p "$W" && build_tree . "$N" "$W" new "$targets" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
else
  build_ab "$BASE_TAR" /tmp/burst "$targets" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
fi
nvcc -O2 -cudart shared -o "$W/launch_burst" bench/experiments/round_trip/launch_burst.cu || exit 1
experiment_env "$W"
declare -A addr
for i in 1 2 3; do echo "native: $("$W/launch_burst" 1000 30)"; done
if [[ -z $BASE_TAR ]]; then
  TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info start_server_as profiled "$N/server/tandemd" cuda "$W/tandemd.log"
  sleep 1.5
  for i in 1 2 3; do echo "tandem: $("$N/tools/tandem" run --servers "${addr[profiled]}" -- "$W/launch_burst" 1000 30 2>&1 | grep burst)"; done
  sleep 1
  stop_experiment_servers
  grep "profile:" "$W/tandemd.log" | head -40
  exit 0
fi
start_ab_servers cuda
sleep 1.5
for round in $(seq "$ROUNDS"); do
  for tree in base new; do
    echo "$tree $round: $("$(ab_build $tree)/tools/tandem" run --servers "${addr[$tree]}" -- "$W/launch_burst" 1000 30 2>&1 | grep burst)"
  done
done
