#!/usr/bin/env bash
# The idle read-back against the keepalive's interval (GPU machine, from the repository root):
# TANDEM_KEEPALIVE_MS 2 (the default), 0.5 and 0.2, CUDA and OpenCL, through one tandemd each,
# ROUNDS interleaved rounds. Shorter intervals reach the 1 and 5 ms gaps, which a 2 ms
# keepalive cannot; the 20 and 100 ms gaps stay about twice the warm latency whatever it is.
#   device tool: run(command="bash bench/experiments/keepalive_interval.sh", carry=[".deps"])
set -u
ROUNDS=${1:-3}
B=/tmp/keepalive-interval W=/tmp/keepalive-interval-work
source bench/experiments/lib.sh
mkdir -p "$W"
cmake -S . -B "$B" -G Ninja -DTANDEM_WERROR=OFF >"$W/cfg.log" 2>&1 &&
  ninja -C "$B" tandemd tandem tandem_cudart tandem_opencl opencl_bench tandem_cuda_bench >"$W/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$W/build.log" "$W/cfg.log" | head -20; exit 1; }
experiment_env "$W"
declare -A addr
for backend in cuda opencl; do
  start_experiment_server "$B/server/tandemd" $backend "$W/tandemd-$backend.log" >"$W/addr"
  addr[$backend]=$(cat "$W/addr")
done
sleep 2
for round in $(seq "$ROUNDS"); do
  for ka in 2 0.5 0.2; do
    echo "== keepalive $ka ms, round $round, cuda:   $(TANDEM_KEEPALIVE_MS=$ka timeout 120 "$B/tools/tandem" run --servers "${addr[cuda]}" -- "$B/bench/cuda_bench" --idle 2>/dev/null | grep readback | idle_rows)"
    echo "== keepalive $ka ms, round $round, opencl: $(TANDEM_KEEPALIVE_MS=$ka timeout 120 "$B/tools/tandem" run --servers "${addr[opencl]}" -- "$B/bench/opencl_bench" --idle 2>/dev/null | idle_rows)"
  done
done
