#!/usr/bin/env bash
# Where the CPU time of a CUDA round trip goes, by function (GPU machine, from the repository
# root): builds Tandem with frame pointers and no debug sections (the copied perf reads no
# symbols from zstd-compressed ones), then records `perf` system-wide while sync_loop
# runs through one CUDA tandemd: launch + synchronize (ROUNDS round trips) over tcp and shm,
# and async launch bursts over tcp. For each, prints the flat profile (self time) of the
# program and of the worker by symbol, and how the samples under their main functions split
# (perf_tree.py). The native loop's profile comes first, for the driver's share.
# With `opencl` first, the same for ocl_loop through one OpenCL tandemd: enqueue + clFinish
# (ROUNDS round trips) over tcp, and bursts of enqueues (ROUNDS / 100 bursts of 1000) natively
# and over tcp.
#   run(command="bash bench/experiments/round_trip/perf_profile.sh [opencl] [ROUNDS]", carry=[".deps", ".scratch"])
set -u
API=cuda
if [[ ${1:-} == opencl ]]; then API=opencl; shift; fi
ROUNDS=${1:-60000}
# The GPU machine has no perf: .scratch/perf holds a copy of one (the binary and the libraries
# it needs beyond glibc and libstdc++), carried with the tree. What it records runs without
# those libraries.
# What the recorded programs run with: perf's own library path must not reach them.
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
if ! command perf --version >/dev/null 2>&1; then
  [[ -x .scratch/perf/perf ]] || { echo "no perf here, and no .scratch/perf/perf"; exit 2; }
  perf() { LD_LIBRARY_PATH=$PWD/.scratch/perf/lib "$PWD/.scratch/perf/perf" "$@"; }
fi
perf --version >/dev/null || exit 2
echo "perf $(perf --version); perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid)"
source bench/experiments/lib.sh
here=bench/experiments/round_trip
N=/tmp/perf-build W=/tmp/perf-work
rm -rf "$W" && mkdir -p "$W"
build_tree . "$N" "$W" new "tandemd tandem tandem_cudart tandem_opencl" -DTANDEM_CUDA_PROGRAMS=OFF \
  -DCMAKE_CXX_FLAGS="-fno-omit-frame-pointer" -DCMAKE_C_FLAGS="-fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" || exit 1
nvcc -O2 -cudart shared -Xcompiler -fno-omit-frame-pointer -o "$W/sync_loop" $here/sync_loop.cu || exit 1
gcc -O2 -fno-omit-frame-pointer -I.deps/include -o "$W/ocl_loop" $here/ocl_loop.c -lOpenCL || exit 1
experiment_env "$W"
declare -A addr

# The functions whose samples perf_tree.py splits: the worker's batch and its receiving and
# sending, and the program's launch and synchronize calls and its half of the link.
WORKER_ANCHORS="Executor::Run Session::HandleBatch Session::Run Session::Execute CudaBackend::OnLaunch
  CudaBackend::OnDeviceSync Session::WithOutput ClientLink::Send RdmEndpoint::Next ProgressLoop cuLaunchKernel cuCtxSynchronize"
PROGRAM_ANCHORS="cudaLaunchKernel namespace)::Launch SessionImpl::Queue ir::Put cudaDeviceSynchronize SyncDevice
  PostAndWait Completion::Wait SessionImpl::FlushLocked RdmEndpoint::Next OnMessage ProgressLoop"
PROGRAM=sync_loop
if [[ $API == opencl ]]; then
  WORKER_ANCHORS="Executor::Run Session::HandleBatch Session::Run Session::Execute OpenCLBackend::OnLaunch
    OpenCLBackend::Prepare OpenCLBackend::OnStreamSync DecodeRequest Session::WithOutput ClientLink::Send
    RdmEndpoint::Next ProgressLoop clEnqueueNDRangeKernel clFinish"
  PROGRAM_ANCHORS="clEnqueueNDRangeKernel EnqueueNDRangeKernel AcquireBuffer SessionImpl::Queue ir::Put clFinish
    ocl::Finish PostAndWait Completion::Wait SessionImpl::FlushLocked RdmEndpoint::Next OnMessage ProgressLoop"
  PROGRAM=ocl_loop
fi
report() {  # report NAME DATA: the flat views and the anchors' split of one recording
  local data=$2 who anchors
  echo "=== $1: samples by process"
  perf report -i "$data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -6
  # The worker is tandemd re-executed through /proc/self/exe: its comm is "exe".
  for who in $PROGRAM exe; do
    echo "=== $1: $who, self time by symbol (>= 0.5% of its samples)"
    echo "--- by shared object"
    perf report -i "$data" --no-children --comm $who --percentage relative --sort dso --stdio -g none \
      --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
    perf report -i "$data" --no-children --comm $who --percentage relative --sort dso,sym --stdio -g none \
      --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 |
      python3 $here/perf_tree.py --flat tandemd="$N/server/tandemd" libtandem-cudart.so="$(find "$N" -name libtandem-cudart.so | head -1)" \
        libtandem-opencl.so="$(find "$N" -name 'libtandem-opencl.so*' -type f | head -1)"
    anchors=$PROGRAM_ANCHORS
    [[ $who == exe ]] && anchors=$WORKER_ANCHORS
    echo "=== $1: $who, split under its functions"
    # shellcheck disable=SC2086 # a list
    perf script -i "$data" --comm $who -F comm,tid,ip,sym,dso 2>/dev/null | python3 $here/perf_tree.py $who $anchors
  done
}

if [[ $API == opencl ]]; then
  BURSTS=$((ROUNDS / 100))
  echo "native async: $(OCL_ICD_VENDORS="$vendors" OCL_ICD_FILENAMES="$libs" "$W/ocl_loop" async 3000)"
  perf record -a -g -F 4000 -o "$W/native.data" -- env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" OCL_ICD_VENDORS="$vendors" \
    OCL_ICD_FILENAMES="$libs" "$W/ocl_loop" async "$ROUNDS" >"$W/native.txt" 2>"$W/native.err" ||
    { echo "perf record failed: $(tail -3 "$W/native.err")"; exit 1; }
  echo "native async, recorded ($BURSTS bursts): $(cat "$W/native.txt")"
  report "native enqueue bursts" "$W/native.data"
  start_server_as tcp "$N/server/tandemd" opencl "$W/tandemd-tcp.log" || exit 1
  a=${addr[tcp]}
  for mode in async launch; do
    echo "tandem tcp $mode: $("$N/tools/tandem" run --servers "$a" -- "$W/ocl_loop" $mode 3000 2>&1 | grep -v '^\[tandem')"
    perf record -a -g -F 4000 -o "$W/$mode.data" -- env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$N/tools/tandem" run --servers "$a" -- \
      "$W/ocl_loop" $mode "$ROUNDS" >"$W/$mode.txt" 2>&1
    echo "tandem tcp $mode, recorded: $(grep -v '^\[tandem' "$W/$mode.txt")"
    report "tandem tcp $mode" "$W/$mode.data"
  done
  stop_tandemd "${pids[-1]}"
  exit 0
fi

echo "native launch: $("$W/sync_loop" launch 3000)"
perf record -a -g -F 4000 -o "$W/native.data" -- env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$W/sync_loop" launch "$ROUNDS" >"$W/native.txt" 2>"$W/native.err" ||
  { echo "perf record failed: $(tail -3 "$W/native.err")"; exit 1; }
echo "native, recorded: $(cat "$W/native.txt")"
report native "$W/native.data"

for prov in tcp shm; do
  [[ $prov == shm ]] && export TANDEM_FABRIC_PROVIDER=shm FI_PROVIDER=shm FI_SHM_DISABLE_CMA=1
  start_server_as $prov "$N/server/tandemd" cuda "$W/tandemd-$prov.log" || continue
  a=${addr[$prov]}
  echo "tandem $prov launch: $("$N/tools/tandem" run --servers "$a" -- "$W/sync_loop" launch 3000 2>&1 | grep -v '^\[tandem')"
  perf record -a -g -F 4000 -o "$W/$prov.data" -- env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$N/tools/tandem" run --servers "$a" -- \
    "$W/sync_loop" launch "$ROUNDS" >"$W/$prov.txt" 2>&1
  echo "tandem $prov, recorded: $(grep -v '^\[tandem' "$W/$prov.txt")"
  report "tandem $prov launch + sync" "$W/$prov.data"
  if [[ $prov == tcp ]]; then
    echo "tandem tcp async: $("$N/tools/tandem" run --servers "$a" -- "$W/sync_loop" async 30 2>&1 | grep -v '^\[tandem')"
    perf record -a -g -F 4000 -o "$W/async.data" -- env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$N/tools/tandem" run --servers "$a" -- \
      "$W/sync_loop" async 300 >"$W/async.txt" 2>&1
    echo "tandem tcp async, recorded: $(grep -v '^\[tandem' "$W/async.txt")"
    report "tandem tcp async launches" "$W/async.data"
  fi
  stop_tandemd "${pids[-1]}"
done
