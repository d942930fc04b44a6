#!/usr/bin/env bash
# Four OpenCL tandemd on the one GPU (GPU machine, from the repository root): the 4-device
# workloads natively and through Tandem with the default server-to-server path, with every
# copy holding the executor (TANDEM_ASYNC_PEER_BYTES=0), and with client-side waits and
# relayed copies (TANDEM_VDMA=0); server 1's executor profile for advection n = 1024.
#   bash bench/experiments/opencl_peer_paths.sh [BUILD_DIR]
set -u
B=${1:-/tmp/tandem-peer}
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh
v=$(native_opencl_vendors /tmp) || exit 1
libs=$(icd_libs "$v")
cmake -S . -B "$B" -G Ninja -DTANDEM_WERROR=OFF -DTANDEM_CUDA_PROGRAMS=OFF >/tmp/peer-cfg.log 2>&1 ||
  { tail -20 /tmp/peer-cfg.log; exit 1; }
ninja -C "$B" tandemd tandem tandem_opencl advection multi_matmul >/tmp/peer-build.log 2>&1 ||
  { grep -E "error" /tmp/peer-build.log | head; exit 1; }
WORKLOADS=("advection --n 1024 --steps 200 --no-check" "advection --n 16384 --steps 100 --no-check" "multi_matmul --n 8192")
echo "== native"
for w in "${WORKLOADS[@]}"; do
  # shellcheck disable=SC2086
  echo "$w: $(OCL_ICD_VENDORS=$v OCL_ICD_FILENAMES=$libs "$B"/examples/opencl/$w --devices 4 | grep '^time: [0-9]')"
done
# config NAME SERVER_VAR=VALUE -- CLIENT_VAR=VALUE
config() {
  local name=$1 senv=$2 cenv=$4 pids=() list="" p i n first=1
  for i in 0 1 2 3; do
    p=$(free_port)
    env "$senv" TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info OCL_ICD_VENDORS="$v" OCL_ICD_FILENAMES="$libs" \
      setsid "$B/server/tandemd" --listen 127.0.0.1:$p --backend opencl >/tmp/peer-td$i.log 2>&1 &
    pids+=($!)
    list=${list:+$list,}127.0.0.1:$p
  done
  sleep 3
  echo "== $name"
  for w in "${WORKLOADS[@]}"; do
    n=$(wc -l </tmp/peer-td1.log)
    # shellcheck disable=SC2086
    echo "$w: $(env "$cenv" timeout 100 "$B/tools/tandem" run --servers "$list" -- "$B"/examples/opencl/$w --devices 4 2>&1 |
      grep -E '^time: [0-9]|rror' | head -3)"
    sleep 0.5
    ((first)) && tail -n +$((n + 1)) /tmp/peer-td1.log | grep "profile:" | sed 's/.*profile: //' | cut -c1-110
    first=0
  done
  for p in "${pids[@]}"; do stop_tandemd "$p"; done
}
config default X=1 -- Y=1
config blocking-peer TANDEM_ASYNC_PEER_BYTES=0 -- Y=1
config vdma0 X=1 -- TANDEM_VDMA=0
