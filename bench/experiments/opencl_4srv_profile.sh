#!/usr/bin/env bash
# Where a step of the 4-server advection goes: four OpenCL tandemd on this machine's OpenCL
# with TANDEM_SERVER_PROFILE=1 (each session's per-command and asynchronous-completion times,
# logged when the session ends) and the client's TANDEM_STATS=1 summary. From the repository
# root:   bash bench/experiments/opencl_4srv_profile.sh [BUILD_DIR] [ADVECTION ARGS...]
# (default: --n 1024 --steps 200). Prints the run's time line, the client's summary and
# server 1's profile. NO_BUILD=1: BUILD_DIR is built already (lib.sh four_advection_servers).
set -u
BLD=${1:-/tmp/tandem-procs}
shift
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(--n 1024 --steps 200)
source bench/experiments/lib.sh
export TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info
four_advection_servers "$BLD" prof
TANDEM_STATS=1 timeout 300 "$BLD/tools/tandem" run --servers "$four" -- "$BLD/examples/opencl/advection" --devices 4 \
  "${ARGS[@]}" --no-check 2>&1 | grep -v '^advection:\|^check:'
sleep 1
echo "== server 1's session profile"
grep "profile:" "$W/prof-1.log" | sed 's/.*profile: //' | cut -c1-120
