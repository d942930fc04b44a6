#!/usr/bin/env bash
# Why the same synchronous round trip through tandemd is fast in one process and several
# microseconds slower in the next (2026-11-27-g: 33.8-46.2 us p50 for one OpenCL loop, native
# within 14.4-17.9): runs sync_loop (CUDA launch + synchronize, COUNT round trips) PROCS times
# natively and PROCS times through one CUDA tandemd over tcp, alternating, each under
# thread_sampler.py, which records every thread's CPUs, CPU time and context switches in the
# program and in the session's worker (Tandem's threads are named tdm-*). One block a process:
# the loop's p50, then the sampler's lines. GPU machine, from the repository root, with a
# build of tandemd, tandem and tandem_cudart in BUILD:
#   run(command="bash bench/experiments/round_trip/spread.sh BUILD [PROCS] [COUNT]", carry=[".deps"])
set -u
BUILD=$1 PROCS=${2:-8} COUNT=${3:-30000}
source bench/experiments/lib.sh
here=bench/experiments/round_trip
W=/tmp/spread-work
rm -rf "$W" && mkdir -p "$W"
nvcc -O2 -cudart shared -o "$W/sync_loop" $here/sync_loop.cu || exit 1
experiment_env "$W"
declare -A addr
start_server_as tcp "$BUILD/server/tandemd" cuda "$W/tandemd.log" || exit 1
server=${pids[-1]}
lib=$(find "$BUILD" -name libtandem-cudart.so | head -1)
echo "lscpu: $(lscpu | grep -E '^(CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))' | tr -s ' ' | tr '\n' ';')"
for r in $(seq "$PROCS"); do
  for how in native tandem; do
    if [[ $how == native ]]; then
      "$W/sync_loop" launch "$COUNT" >"$W/loop.out" 2>&1 &
    else
      LD_PRELOAD=$lib TANDEM_SERVERS=${addr[tcp]} "$W/sync_loop" launch "$COUNT" >"$W/loop.out" 2>&1 &
    fi
    prog=$!
    python3 $here/thread_sampler.py --interval-ms 10 --children-of worker="$server" program=$prog >"$W/sample.txt" 2>&1
    wait $prog
    echo "== process $r $how: $(grep -v '^\[tandem' "$W/loop.out" | tr '\n' ' ')"
    # Threads that used no CPU (the driver's sleepers) say nothing here.
    awk '$0 !~ /cpu_ms=0 / || /^(overlap|span)/' "$W/sample.txt"
  done
done
