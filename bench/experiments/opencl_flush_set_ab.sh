#!/usr/bin/env bash
# A/B of TANDEM_FLUSH_AFTER_SET (flush every program queue after a user event or a
# server-to-server gate is set) on the 4-server advection: four OpenCL tandemd with it off and
# four with it on, run in alternating rounds. From the repository root:
#   bash bench/experiments/opencl_flush_set_ab.sh [ROUNDS] [BUILD_DIR]   (NO_BUILD=1: built)
# Prints ms/step and the checksum line's digest per round (they must agree within a size).
# SIZES (env): the advection arguments of each size, ';'-separated.
set -u
ROUNDS=${1:-3}
BLD=${2:-/tmp/tandem-procs}
source bench/experiments/lib.sh
export TANDEM_FLUSH_AFTER_SET=0
four_advection_servers "$BLD" flush0
off=$four
export TANDEM_FLUSH_AFTER_SET=1
for i in 0 1 2 3; do start_server_as "on$i" "$BLD/server/tandemd" opencl "$W/flush1-$i.log"; done
on=${addr[on0]},${addr[on1]},${addr[on2]},${addr[on3]}
sleep 2
ADV=$BLD/examples/opencl/advection
run() {  # run SERVERS ARGS...: "ms/step digest"
  local servers=$1 out ms sum
  shift
  out=$(timeout 300 "$BLD/tools/tandem" run --servers "$servers" -- "$ADV" --devices 4 "$@" 2>&1)
  ms=$(sed -n 's/^time: .*(\([0-9.]*\) ms\/step).*/\1/p' <<<"$out")
  sum=$(grep '^advection: checksum' <<<"$out" | md5sum | cut -c1-8)
  if [[ -z $ms ]]; then echo "FAILED($(tail -2 <<<"$out" | tr '\n' ' '))"; else echo "$ms $sum"; fi
}
SIZES=${SIZES:-"--n 1024 --steps 200;--n 8192 --steps 100;--n 16384 --steps 50"}
IFS=';' read -r -a sizes <<<"$SIZES"
for size in "${sizes[@]}"; do
  echo "== advection $size, four servers, ms/step (checksum digest), $ROUNDS rounds"
  a="" b=""
  for ((r = 1; r <= ROUNDS; ++r)); do
    # shellcheck disable=SC2086 # size is a list of arguments
    a+="$(run "$off" $size --no-check) | "
    # shellcheck disable=SC2086
    b+="$(run "$on" $size --no-check) | "
  done
  echo "flush-after-set off: $a"
  echo "flush-after-set on:  $b"
done
