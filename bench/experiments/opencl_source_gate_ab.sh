#!/usr/bin/env bash
# Source halves gated on the host (TANDEM_EXP_SOURCE_GATE=1) against reads that wait on the
# program's kernel event in the implementation, in one build: four OpenCL tandemd per setting
# (8 in all, this machine's OpenCL), the 4-device advection through each set in alternating
# rounds, ms/step, and the native 1- and 4-process rows once per size for scale.
#   bash bench/experiments/opencl_source_gate_ab.sh [ROUNDS] [BUILD_DIR]
set -u
ROUNDS=${1:-3}
BLD=${2:-/tmp/tandem-gate}
source bench/experiments/lib.sh
W=$BLD-work
mkdir -p "$W"
if [[ ${NO_BUILD:-0} != 1 ]]; then
  build_tree . "$BLD" "$W" gate "tandemd tandem tandem_opencl advection advection_procs" \
    -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
fi
experiment_env "$W"
declare -A addr
CONFIGS=(plain gate)
for i in 0 1 2 3; do
  start_server_as "plain$i" "$BLD/server/tandemd" opencl "$W/td-plain-$i.log"
  TANDEM_EXP_SOURCE_GATE=1 start_server_as "gate$i" "$BLD/server/tandemd" opencl "$W/td-gate-$i.log"
done
sleep 2
ADV=$BLD/examples/opencl/advection
ms() { sed -n 's/^time: .*(\([0-9.]*\) ms\/step).*/\1/p'; }
SIZES=${SIZES:-"--n 1024 --steps 200;--n 8192 --steps 100;--n 16384 --steps 50"}
IFS=';' read -r -a sizes <<<"$SIZES"
for size in "${sizes[@]}"; do
  # shellcheck disable=SC2086 # size is a list of arguments
  echo "== advection $size, ms/step; native 1 process $(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs \
    timeout 300 "$ADV" --devices 4 $size --no-check | ms), 4 processes $(OCL_ICD_VENDORS=$vendors \
    OCL_ICD_FILENAMES=$libs timeout 300 "$BLD/bench/advection_procs" --procs 4 $size | ms)"
  declare -A res=()
  for ((r = 1; r <= ROUNDS; ++r)); do
    for c in "${CONFIGS[@]}"; do
      list=${addr[${c}0]},${addr[${c}1]},${addr[${c}2]},${addr[${c}3]}
      # shellcheck disable=SC2086
      out=$(timeout 300 "$BLD/tools/tandem" run --servers "$list" -- "$ADV" --devices 4 $size --no-check 2>&1)
      t=$(ms <<<"$out")
      [[ -n $t ]] || t="FAILED($(tail -2 <<<"$out" | tr '\n' ' '))"
      sum=$(grep '^advection: checksum' <<<"$out" | md5sum | cut -c1-6)
      res[$c]+="$t ($sum) "
    done
  done
  for c in "${CONFIGS[@]}"; do printf '  %-6s %s\n' "$c" "${res[$c]}"; done
done
grep -h "Warn\|rror" "$W"/td-*.log | sort | uniq -c | head -5
