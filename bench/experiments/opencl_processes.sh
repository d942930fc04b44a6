#!/usr/bin/env bash
# The 4-device advection on one GPU: how much of the gap to the single-process native run is
# four processes sharing the GPU, and how much is Tandem. From the repository root:
#   bash bench/experiments/opencl_processes.sh [ROUNDS] [BUILD_DIR]
# Rows, each in ROUNDS alternating rounds, ms/step (the program's own "time:" line):
#   native-1proc   examples/opencl/advection --devices 4: four queues in ONE process and
#                  context (the issue's baseline)
#   native-4proc   bench/advection_procs.c: the same bands in four processes, a
#                  context each, halos through host shared memory
#   tandem-1srv    advection --devices 4 through ONE tandemd (one context, four queues)
#   tandem-4srv    advection --devices 4 through four tandemd (four contexts; halo copies
#                  server to server), as bench/run_bench.sh's workload rows
#   tandem-4srv-ka0  the same with TANDEM_KEEPALIVE_MS=0 (threads spin 100 us after activity,
#                  not the keepalive's interval + 1 ms)
# and first the threads busy (>= 20% CPU) while the 4-server run steps, by command name.
# Every row prints its checksum line's digest; they must agree within a size. SIZES (env):
# the advection arguments of each size, ';'-separated (default: n = 1024, 8192, 16384).
set -u
ROUNDS=${1:-3}
BLD=${2:-/tmp/tandem-procs}
source bench/experiments/lib.sh
four_advection_servers "$BLD" tandemd
one=${addr[s0]}
ADV=$BLD/examples/opencl/advection
# run ROW ARGS...: one run of ROW at the advection ARGS; prints "ms/step checksum-digest".
run() {
  local row=$1 out
  shift
  case $row in
    native-1proc) out=$(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 300 "$ADV" --devices 4 "$@" 2>&1) ;;
    native-4proc) out=$(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 300 "$BLD/bench/advection_procs" --procs 4 "$@" 2>&1) ;;
    tandem-1srv) out=$(timeout 300 "$BLD/tools/tandem" run --servers "$one" -- "$ADV" --devices 4 "$@" 2>&1) ;;
    tandem-4srv) out=$(timeout 300 "$BLD/tools/tandem" run --servers "$four" -- "$ADV" --devices 4 "$@" 2>&1) ;;
    tandem-4srv-ka0) out=$(TANDEM_KEEPALIVE_MS=0 timeout 300 "$BLD/tools/tandem" run --servers "$four" -- "$ADV" \
      --devices 4 "$@" 2>&1) ;;
  esac
  run_summary "$out"
}
ROWS=(native-1proc native-4proc tandem-1srv tandem-4srv tandem-4srv-ka0)
# Busy threads while the 4-server run steps: the machine has $(nproc) cores.
census() {
  # shellcheck disable=SC2086 # a list of arguments
  "$BLD/tools/tandem" run --servers "$four" -- "$ADV" --devices 4 ${CENSUS_ARGS:---n 8192 --steps 400} --no-check \
    >/dev/null 2>&1 &
  local run=$!
  sleep 3
  top -H -b -n 2 -d 1 -w 160 | awk '/^top -/{++it} it==2 && $1 ~ /^[0-9]+$/ && $9+0 >= 20 {print}' >"$W/census.txt"
  wait $run
  echo "== threads at >= 20% CPU during tandem-4srv (${CENSUS_ARGS:-n 8192}), $(nproc) cores: $(wc -l <"$W/census.txt")"
  awk '{c[$NF]++; s[$NF]+=$9} END {for (k in c) printf "  %-18s %2d threads, %5.0f%% CPU\n", k, c[k], s[k]}' "$W/census.txt"
}
census
SIZES=${SIZES:-"--n 1024 --steps 200;--n 8192 --steps 100;--n 16384 --steps 50"}  # ';'-separated
IFS=';' read -r -a sizes <<<"$SIZES"
for size in "${sizes[@]}"; do
  echo "== advection $size, ms/step (checksum digest), $ROUNDS rounds"
  declare -A res=()
  for ((r = 1; r <= ROUNDS; ++r)); do
    for row in "${ROWS[@]}"; do
      # shellcheck disable=SC2086 # size is a list of arguments
      res[$row]+="$(run $row $size --no-check) | "
    done
  done
  for row in "${ROWS[@]}"; do printf '%-13s %s\n' "$row" "${res[$row]}"; done
done
