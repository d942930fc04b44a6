#!/usr/bin/env bash
# Where a synchronous OpenCL / CUDA round trip spends its time on the server, against the same
# calls natively: the native loops print the enqueue (launch) call's and the finish's share;
# through one tandemd with TANDEM_SERVER_PROFILE=1, the server logs each command's mean time
# (Launch, StreamSync/DeviceSync, the batch) when the session ends (GPU machine, from the
# repository root):   bash bench/experiments/native_gap/server_split.sh
# With launch_split.patch applied to a copy of the tree (never to Tandem itself), the OpenCL
# backend's Launch is split into its legs (checks, arguments, queue and wait list, the
# clEnqueueNDRangeKernel call, the event's bookkeeping), and the loops include 1000
# asynchronous enqueues + one clFinish (ocl_loop async, sync_loop async).
set -u
here=bench/experiments/native_gap rt=bench/experiments/round_trip
source bench/experiments/lib.sh
P=/tmp/split W=$P-work
rm -rf "$W" && mkdir -p "$W" || exit 1
S=$P-src
rm -rf $S && mkdir -p $S && tar --exclude=./build -cf - . | tar -xf - -C $S && (cd $S && git apply $here/launch_split.patch) || exit 1
build_tree $S "$P-build" "$W" new "tandemd tandem tandem_cudart tandem_opencl" || exit 1
gcc -O2 -I.deps/include -o "$W/ocl_loop" $rt/ocl_loop.c -lOpenCL && nvcc -O2 -cudart shared -o "$W/sync_loop" $rt/sync_loop.cu &&
  gcc -O2 -I.deps/include -o "$W/ocl_gap" $here/ocl_gap.c -lOpenCL -lpthread || exit 1
experiment_env "$W"
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs
for round in 1 2; do
  echo "== round $round"
  "$W/ocl_gap" b2b 0
  for backend in opencl cuda; do
    log=$W/tandemd-$backend-$round.log
    port=$(free_port)
    TANDEM_LOG=info TANDEM_SERVER_PROFILE=1 setsid "$P-build/server/tandemd" --listen 127.0.0.1:$port --backend $backend >"$log" 2>&1 &
    pid=$!
    tandemd_listens $pid "$log" || { echo "tandemd did not start: $(tail -1 "$log")"; exit 1; }
    if [[ $backend == opencl ]]; then prog=("$W/ocl_loop"); else prog=("$W/sync_loop"); fi
    for m in launch async; do
      echo "-- $backend native: $(timeout 60 "${prog[@]}" $m | sed 's/ p10.*//')"
      echo "-- $backend tandem: $(timeout 60 "$P-build/tools/tandem" run --servers 127.0.0.1:$port -- "${prog[@]}" $m | sed 's/ p10.*//')"
    done
    sleep 0.5
    kill -TERM -- -$pid 2>/dev/null
    wait $pid 2>/dev/null
    grep -o "profile: .*" "$log" | grep -E "Launch|Sync|~launch|batch"
  done
done
