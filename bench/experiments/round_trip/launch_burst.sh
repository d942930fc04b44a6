#!/usr/bin/env bash
# Where CUDA's asynchronous launch rate goes through Tandem (GPU machine, from the repository
# root): builds tandemd, the tandem tool and the runtime, then runs launch_burst (30 bursts
# of 1000 empty-kernel launches, each then synchronized) three times natively and three
# times through one CUDA tandemd with TANDEM_SERVER_PROFILE=1, and prints the worker's
# profile: its time per Launch and per request batch.
#   device tool: run(command="bash bench/experiments/round_trip/launch_burst.sh", carry=[".deps"])
set -u
source scripts/lib/tandemd.sh
B=/tmp/burst-build
cmake -S . -B $B -G Ninja -DTANDEM_WERROR=OFF -DTANDEM_CUDA_PROGRAMS=OFF >/dev/null && ninja -C $B tandemd tandem tandem_cudart >/tmp/burst-build.log 2>&1 || { tail -20 /tmp/burst-build.log; exit 1; }
nvcc -O2 -cudart shared -o /tmp/launch_burst bench/experiments/round_trip/launch_burst.cu || exit 1
for i in 1 2 3; do echo "native: $(/tmp/launch_burst 1000 30)"; done
p=$(free_port)
TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info setsid $B/server/tandemd --listen 127.0.0.1:$p --backend cuda > /tmp/burst-srv.log 2>&1 &
pid=$!
sleep 1.5
for i in 1 2 3; do echo "tandem: $($B/tools/tandem run --servers 127.0.0.1:$p -- /tmp/launch_burst 1000 30 2>&1 | grep burst)"; done
sleep 1
stop_tandemd $pid
grep "profile:" /tmp/burst-srv.log | head -40
