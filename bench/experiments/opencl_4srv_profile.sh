#!/usr/bin/env bash
# Where a step of the 4-server advection goes: four OpenCL tandemd on this machine's OpenCL
# with TANDEM_SERVER_PROFILE=1 (each session's per-command and asynchronous-completion times,
# logged when the session ends) and the client's TANDEM_STATS=1 summary. From the repository
# root:   bash bench/experiments/opencl_4srv_profile.sh [BUILD_DIR] [ADVECTION ARGS...]
# (default: --n 1024 --steps 200). Prints the run's time line, the client's summary and
# server 1's profile.
set -u
BLD=${1:-/tmp/tandem-procs}
shift
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(--n 1024 --steps 200)
source bench/experiments/lib.sh
W=$BLD-work
mkdir -p "$W"
if [[ ! -x $BLD/server/tandemd ]]; then
  build_tree . "$BLD" "$W" procs "tandemd tandem tandem_opencl advection" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
fi
experiment_env "$W"
export TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info
declare -A addr
for i in 0 1 2 3; do start_server_as "s$i" "$BLD/server/tandemd" opencl "$W/prof-$i.log"; done
sleep 2
four=${addr[s0]},${addr[s1]},${addr[s2]},${addr[s3]}
TANDEM_STATS=1 timeout 300 "$BLD/tools/tandem" run --servers "$four" -- "$BLD/examples/opencl/advection" --devices 4 \
  "${ARGS[@]}" --no-check 2>&1 | grep -v '^advection:\|^check:'
sleep 1
echo "== server 1's session profile"
grep "profile:" "$W/prof-1.log" | sed 's/.*profile: //' | cut -c1-120
