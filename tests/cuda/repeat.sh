#!/usr/bin/env bash
# repeat.sh TANDEMD LIB PROGRAM RUNS OUTDIR [ARG...]
# Hunts an intermittent hang: runs PROGRAM (an ordinary CUDA program) through Tandem RUNS times,
# each bounded by REPEAT_TIMEOUT seconds (default 30), on REPEAT_SERVERS fresh CUDA tandemd on
# 127.0.0.1 (default 2; TANDEM_SERVERS names them all, so TANDEM_REDUNDANCY=2 in the
# environment makes two replicas). The servers and the program log at TANDEM_LOG (default
# debug). A run that outlives its bound gets, before it is killed, every thread's stack of the
# program and of each tandemd process (gdb where installed, else elfutils' eu-stack: on PATH or a
# copy in .scratch/eustack with its libdw and libelf in lib/, as the GPU machine has neither;
# else each thread's name, kernel wait channel and kernel stack), written to OUTDIR/hang-N/
# with both sides' logs. Prints one
# line a run and a summary; exits 1 if any run hung or failed. GPU machine, for example:
#   TANDEM_REDUNDANCY=2 bash tests/cuda/repeat.sh build/server/tandemd \
#     build/frontends/cuda/libtandem-cudart.so build/tests/cuda/programs/callbacks 60 $OUT/rep
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/tandemd.sh"
tandemd=$1 lib=$2 prog=$3 runs=$4 out=$5
shift 5
timeout_s=${REPEAT_TIMEOUT:-30} nservers=${REPEAT_SERVERS:-2}
export TANDEM_LOG=${TANDEM_LOG:-debug}
mkdir -p "$out"

# Every thread's stack of process PID into FILE.
dump_stacks() {
  local pid=$1 file=$2 t
  {
    echo "== process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
    if command -v gdb >/dev/null; then
      timeout 60 gdb -p "$pid" -batch -nx -ex "set pagination off" -ex "thread apply all bt" 2>&1
    elif [[ -n $eu_stack ]]; then
      timeout 60 $eu_stack -i -p "$pid" 2>&1
    else
      for t in /proc/"$pid"/task/*; do
        echo "-- thread ${t##*/} $(cat "$t/comm" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) state=$(awk '{print $3}' "$t/stat" 2>/dev/null)"
        cat "$t/stack" 2>/dev/null
      done
    fi
  } >>"$file"
}

eu_stack=""
if command -v eu-stack >/dev/null; then eu_stack=eu-stack
elif [[ -x .scratch/eustack/eu-stack ]]; then eu_stack="env LD_LIBRARY_PATH=$PWD/.scratch/eustack/lib $PWD/.scratch/eustack/eu-stack"
fi

server_pids=() servers=()
cleanup() {
  local pid
  for pid in "${server_pids[@]}"; do stop_tandemd "$pid"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_servers() {
  local i port log pid
  server_pids=() servers=()
  for ((i = 0; i < nservers; ++i)); do
    port=$(free_port) log=$out/tandemd-$i.log
    setsid "$tandemd" --listen "127.0.0.1:$port" --backend cuda >"$log" 2>&1 &
    pid=$!
    tandemd_listens "$pid" "$log" || { echo "tandemd $i did not start:"; tail -5 "$log"; return 1; }
    server_pids+=("$pid") servers+=("127.0.0.1:$port")
  done
}

hung=0 failed=0 passed=0
echo "stacks by: $(command -v gdb || echo "${eu_stack:-kernel stacks only}")"
for ((r = 1; r <= runs; ++r)); do
  start_servers || exit 1
  list=$(IFS=,; echo "${servers[*]}")
  LD_PRELOAD=$lib TANDEM_SERVERS=$list "$prog" "$@" >"$out/run.out" 2>"$out/run.err" &
  pid=$!
  deadline=$((SECONDS + timeout_s))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    hung=$((hung + 1))
    d=$out/hang-$r
    mkdir -p "$d"
    dump_stacks "$pid" "$d/stacks.txt"
    for s in "${server_pids[@]}"; do
      for w in $s $(pgrep -P "$s"); do dump_stacks "$w" "$d/stacks.txt"; done
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    cp "$out/run.out" "$out/run.err" "$out"/tandemd-*.log "$d/"
    echo "run $r: HUNG after ${timeout_s} s (stacks and logs in $d)"
  else
    wait "$pid"
    rc=$?
    if ((rc == 0)); then passed=$((passed + 1)); else
      failed=$((failed + 1))
      mkdir -p "$out/fail-$r" && cp "$out/run.out" "$out/run.err" "$out"/tandemd-*.log "$out/fail-$r/"
      echo "run $r: exit $rc (logs in $out/fail-$r)"
    fi
  fi
  cleanup
done
echo "repeat: $runs runs of $(basename "$prog"): $passed passed, $failed failed, $hung hung"
((hung == 0 && failed == 0))
