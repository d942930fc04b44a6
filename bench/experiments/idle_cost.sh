#!/usr/bin/env bash
# Where the idle read-back's cost comes from (GPU machine, from the repository root): the CUDA
# idle read-back natively and through one tandemd, the program's thread sleeping through each
# gap (--idle) or busy-waiting (--idle-busy), then through Tandem with keepalive off; and the
# same with low-priority spinners on every core (is it the CPU going idle?).
#   bash bench/experiments/idle_cost.sh [BUILD_DIR]
set -u
B=${1:-/tmp/tandem-idle}
source scripts/lib/tandemd.sh
cmake -S . -B "$B" -G Ninja -DTANDEM_WERROR=OFF >/tmp/idle-cfg.log 2>&1 || { tail -20 /tmp/idle-cfg.log; exit 1; }
ninja -C "$B" tandemd tandem tandem_cudart tandem_cuda_bench >/tmp/idle-build.log 2>&1 ||
  { grep -E "error" /tmp/idle-build.log | head; exit 1; }
p=$(free_port)
setsid "$B/server/tandemd" --listen 127.0.0.1:$p --backend cuda >/tmp/idle-tandemd.log 2>&1 &
pid=$!
trap 'stop_tandemd $pid' EXIT
sleep 2
tandem() { TANDEM_FAILOVER_TIMEOUT_MS=600000 timeout 120 "$B/tools/tandem" run --servers 127.0.0.1:$p -- "$@"; }
for m in --idle --idle-busy; do
  echo "== tandem $m"; tandem "$B/bench/cuda_bench" $m 2>&1 | grep readback
  echo "== native $m"; timeout 60 "$B/bench/cuda_bench" $m 2>&1 | grep readback
done
echo "== tandem --idle-busy, keepalive off"
TANDEM_KEEPALIVE_MS=0 tandem "$B/bench/cuda_bench" --idle-busy 2>&1 | grep readback
echo "== with SCHED_IDLE spinners on every core"
sp=()
for _ in $(seq "$(nproc)"); do chrt -i 0 bash -c 'while :; do :; done' & sp+=($!); done
echo "-- native --idle"; timeout 60 "$B/bench/cuda_bench" --idle 2>&1 | grep readback
echo "-- tandem --idle"; tandem "$B/bench/cuda_bench" --idle 2>&1 | grep readback
kill "${sp[@]}"; wait "${sp[@]}" 2>/dev/null
