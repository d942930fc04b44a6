#!/usr/bin/env bash
# The CUDA idle read-back through one tandemd, split into its legs (client post -> server runs
# it -> server done -> client has the reply) by idle_trace.py from both sides' traces, keepalive
# on (its default): the program's thread sleeping through each gap, then busy-waiting. GPU
# machine, from the repository root:
#   bash bench/experiments/idle_legs.sh [BUILD_DIR] [OUT_DIR]
set -u
B=${1:-/tmp/tandem-legs}
O=${2:-/tmp/tandem-legs-out}
source bench/experiments/lib.sh
mkdir -p "$O"
W=$O
build_tree . "$B" "$O" head "tandemd tandem tandem_cudart tandem_cuda_bench" || exit 1
experiment_env "$O"
for mode in --idle --idle-busy; do
  port=$(free_port)
  TANDEM_TRACE=1 TANDEM_LOG_TIME=1 setsid "$B/server/tandemd" --listen 127.0.0.1:$port --backend cuda \
    >"$O/server$mode.log" 2>&1 &
  pids+=($!)
  sleep 2
  TANDEM_TRACE=1 TANDEM_LOG_TIME=1 timeout 120 "$B/tools/tandem" run --servers 127.0.0.1:$port -- \
    "$B/bench/cuda_bench" $mode >"$O/client$mode.out" 2>"$O/client$mode.log"
  echo "== $mode: $(grep readback "$O/client$mode.out" | tr -s ' ' | tr '\n' ';')"
  python3 bench/experiments/idle_trace.py "$O/client$mode.log" "$O/server$mode.log"
  stop_experiment_servers
  pids=()
done
