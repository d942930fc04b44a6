#!/usr/bin/env bash
# libfabric 1.17 offers two RDM protocols over TCP: `tcp` (tcp;ofi_rxm, what Tandem's
# TANDEM_FABRIC_PROVIDER=tcp gets on 1.17) and `net` (the native TCP RDM, renamed `tcp` from
# 1.18 on). This measures, on the GPU machine, from the repository root after a build in
# BUILD (default /tmp/tgX), for each of the two: the provider's own round trip (fi_pingpong,
# 8 and 256 B), Tandem's fabric layer (tandem_fabric_pingpong), and the synchronous round
# trips of the benchmark's launch + synchronize targets (CUDA launch + cudaDeviceSynchronize,
# OpenCL enqueue + clFinish), natively and through one tandemd, ROUNDS times alternating.
# `tcp` and `net` are named as stacks here ("tcp;ofi_rxm" and "net"), whatever "tcp" means to
# Tandem. Scratch files: /tmp/pn_* (one run at a time).
# (The target of each: native + one round trip of the provider + 5 us.)
#   FI_PINGPONG=... BUILD=... ROUNDS=3 bash bench/experiments/provider_net.sh
set -u
here=bench/experiments/round_trip
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh
B=${BUILD:-/tmp/tgX} ROUNDS=${ROUNDS:-3}
FPP=${FI_PINGPONG:-$(command -v fi_pingpong || true)}
gcc -O2 -I.deps/include -o /tmp/pn_ocl_loop $here/ocl_loop.c -lOpenCL &&
  nvcc -O2 -cudart shared -o /tmp/pn_sync_loop $here/sync_loop.cu || exit 1
vendors=$(native_opencl_vendors /tmp/pn-work) || exit 1
libs=$(icd_libs "$vendors")
export POCL_CACHE_DIR=/tmp/pn-work/pocl
native() { OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs "$@"; }  # the GPU's own OpenCL
mkdir -p "$POCL_CACHE_DIR"
p50() { sed -n 's/.*p50 \([0-9.]*\) us.*/\1/p' | head -1; }

for prov in "tcp;ofi_rxm" net; do
  echo "=== provider $prov"
  if [[ -n $FPP ]]; then
    for size in 8 256; do
      port=$(free_port)
      timeout 60 "$FPP" -p "$prov" -e rdm -I 20000 -S $size -B "$port" >/dev/null 2>&1 &
      srv=$!
      sleep 0.5
      half=$(timeout 60 "$FPP" -p "$prov" -e rdm -I 20000 -S $size -P "$port" 127.0.0.1 2>&1 | awk 'NF >= 7 && $1 ~ /^[0-9]/ { v = $(NF - 1) } END { print v }')
      wait $srv
      if [[ -n $half ]]; then echo "fi_pingpong $size B round trip (mean): $(awk -v h="$half" 'BEGIN { printf "%.2f", 2 * h }') us"
      else echo "fi_pingpong $size B: failed"; fi
    done
  fi
  timeout 120 "$B/fabric/tandem_fabric_pingpong" --provider "$prov" --iters 20000 --size 256 2>&1 | head -3
  for api in cuda opencl; do
    prog=/tmp/pn_sync_loop; [[ $api == opencl ]] && prog=/tmp/pn_ocl_loop
    port=$(free_port)
    env TANDEM_FABRIC_PROVIDER=$prov OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$B/server/tandemd" --listen 127.0.0.1:$port --backend $api \
      >/tmp/pn-srv-$api-$prov.log 2>&1 &
    pid=$!
    tandemd_listens "$pid" /tmp/pn-srv-$api-$prov.log ||
      { echo "tandemd ($api, $prov) did not start"; tail -5 /tmp/pn-srv-$api-$prov.log; stop_tandemd $pid; continue; }
    for r in $(seq "$ROUNDS"); do
      n=$(native $prog launch | p50)
      t=$(TANDEM_FABRIC_PROVIDER=$prov timeout 120 "$B/tools/tandem" run --servers 127.0.0.1:$port -- $prog launch 2>&1 | p50)
      echo "$api launch + sync, round $r: native $n us, tandem ($prov) $t us"
    done
    stop_tandemd $pid
  done
done
