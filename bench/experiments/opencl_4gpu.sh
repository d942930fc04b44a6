#!/usr/bin/env bash
# The 4-device OpenCL workloads where each tandemd has a GPU of its own (a 4-GPU machine; on
# a 2-GPU one, server i sees GPU i % 2):
# natively, one process and one context holding the four GPUs (the issue's baseline); through
# Tandem, four tandemd, server i seeing GPU i alone (CUDA_VISIBLE_DEVICES=i), halos server to
# server. Alternating rounds; every step bounded in time. From the repository root:
#   bash bench/experiments/opencl_4gpu.sh [ROUNDS] [BUILD_DIR] [LOG]   (NO_BUILD=1: built)
# Lines go to LOG as they come (default /dev/stdout). ROWS (env): the programs and arguments
# to run, ';'-separated (default: lib.sh workload_rows). Four native processes (one GPU each)
# run beside each advection row.
set -u
ROUNDS=${1:-2}
BLD=${2:-/tmp/tandem-4gpu}
LOG=${3:-/dev/stdout}
say() { echo "$*" >>"$LOG"; }
source bench/experiments/lib.sh
W=$BLD-work
mkdir -p "$W"
say "== $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | tr '\n' ' ')"
if [[ ${NO_BUILD:-0} != 1 ]]; then
  timeout 300 bash -c "source bench/experiments/lib.sh; build_tree . '$BLD' '$W' 4gpu \
    'tandemd tandem tandem_opencl advection multi_matmul advection_procs' -DTANDEM_CUDA_PROGRAMS=OFF" || { say "build failed"; exit 1; }
  say "built"
fi
PER_GPU=1 NO_BUILD=1 four_advection_servers "$BLD" tandemd
run() {  # run native|tandem|procs PROGRAM ARGS...: "time digest [platform]" (procs: advection only)
  local how=$1 prog=$2 out summary
  shift 2
  if [[ $how == procs ]]; then  # advection in one process per GPU, halos through host shared memory
    out=$(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 60 "$BLD/bench/advection_procs" --procs 4 "$@" 2>&1)
  elif [[ $how == native ]]; then
    out=$(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 60 "$BLD/examples/opencl/$prog" --devices 4 "$@" 2>&1)
  else
    out=$(timeout 60 "$BLD/tools/tandem" run --servers "$four" -- "$BLD/examples/opencl/$prog" --devices 4 "$@" 2>&1)
  fi
  summary=$(run_summary "$out")
  [[ $summary == FAILED* ]] && { echo "$summary"; return; }
  echo "$summary [$(grep -m1 '^time: platform' <<<"$out" | sed 's/^time: //')]"
}
if [[ -n ${ROWS:-} ]]; then IFS=';' read -r -a rows <<<"$ROWS"; else workload_rows; fi
for row in "${rows[@]}"; do
  say "== $row (ms/step or s), $ROUNDS rounds"
  for ((r = 1; r <= ROUNDS; ++r)); do
    # One context over four GPUs is slow (635 and 2519 ms/step at n = 8192 and 16384, 4x H200):
    # fewer steps there keep each run inside its bound; ms/step compares.
    native_row=$row
    case $row in
      *"--n 8192 --steps 100"*) native_row=${row/--steps 100/--steps 10} ;;
      *"--n 16384 --steps 50"*) native_row=${row/--steps 50/--steps 5} ;;
    esac
    # shellcheck disable=SC2086
    say "native: $(run native $native_row)"
    # shellcheck disable=SC2086
    say "tandem: $(run tandem $row)"
    # shellcheck disable=SC2086
    [[ $row == advection* ]] && say "native, 4 processes: $(run procs $row)"
  done
done
say "== done"
