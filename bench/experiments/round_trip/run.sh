#!/usr/bin/env bash
# Where a synchronous round trip's time goes (GPU machine, from the repository root): builds
# a copy of the tree with probe.patch (timestamps at each hand-over: the client's post and
# send, the fabric's receive and delivery, the worker's executor, the reply's parse, the
# waiter's return; TANDEM_PROBE=FILE writes them), then runs sync_loop (3000 idle
# synchronizes, or launch + synchronize) and sync_after_gap (synchronizes after a sleep)
# through one tandemd, and prints each leg's p10/p50/p90 (legs.py joins the client's and
# the server's rows by command seq). probe.patch applies to 7fac1ba and later (regenerated for the worker's in-place batches: "-> executor" is then the receiving thread starting the batch itself); it is never built into Tandem.
#   bash bench/experiments/round_trip/run.sh [tcp|shm]
set -u
here=bench/experiments/round_trip
source scripts/lib/tandemd.sh
S=/tmp/probe-src P=/tmp/probe-build prov=${1:-tcp}
rm -rf $S && mkdir -p $S && tar --exclude=./build -cf - . | tar -xf - -C $S && (cd $S && git apply $here/probe.patch) || exit 1
cmake -S $S -B $P -G Ninja -DTANDEM_WERROR=OFF -DTANDEM_CUDA_PROGRAMS=OFF >/dev/null &&
  ninja -C $P tandemd tandem tandem_cudart tandem_opencl >/tmp/probe-build.log 2>&1 || { grep -E "error|FAILED" /tmp/probe-build.log | head; exit 1; }
gcc -O2 -I.deps/include -o /tmp/ocl_loop $here/ocl_loop.c -lOpenCL && nvcc -O2 -cudart shared -o /tmp/sync_loop $here/sync_loop.cu && nvcc -O2 -cudart shared -o /tmp/sync_after_gap $here/sync_after_gap.cu || exit 1
env=""; [[ $prov == shm ]] && env="TANDEM_FABRIC_PROVIDER=shm FI_PROVIDER=shm FI_SHM_DISABLE_CMA=1"
source scripts/lib/opencl-vendors.sh
vendors=$(native_opencl_vendors /tmp/probe-work) || exit 1
libs=$(icd_libs "$vendors")
export POCL_CACHE_DIR=/tmp/probe-work/pocl
mkdir -p "$POCL_CACHE_DIR"
probe() {  # probe SKIP BACKEND PROGRAM ARGS...
  local skip=$1 backend=$2; shift 2
  rm -f /tmp/pr.*
  local p; p=$(free_port)
  env $env TANDEM_PROBE=/tmp/pr OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid $P/server/tandemd \
    --listen 127.0.0.1:$p --backend $backend >/tmp/probe-srv.log 2>&1 &
  local pid=$!
  sleep 1.5
  echo "== native: $(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs "$@")"
  echo "== tandem ($prov): $(env $env TANDEM_PROBE=/tmp/pr timeout 120 $P/tools/tandem run --servers 127.0.0.1:$p -- "$@" 2>&1 | grep -v '^\[tandem')"
  stop_tandemd $pid
  python3 $here/legs.py /tmp/pr "$skip"
}
probe 300 cuda /tmp/sync_loop idle
probe 300 cuda /tmp/sync_loop launch
for g in "1 400" "20 150"; do probe 20 cuda /tmp/sync_after_gap $g; done
probe 300 opencl /tmp/ocl_loop idle
probe 300 opencl /tmp/ocl_loop launch
