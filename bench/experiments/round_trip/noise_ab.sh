#!/usr/bin/env bash
# Do other threads' timer wake-ups slow a synchronous round trip? Tandem's idle threads nap
# 20 us at a time beside a thread that reads its own reply (spread.sh: four threads, about
# 12,000 wake-ups a second each, on other CPUs). Runs ROUNDS rounds of: sync_loop launch +
# synchronize (COUNT round trips) natively and through one CUDA tandemd over tcp, and
# fi_pingpong's 8 B round trip over net (where FI_PINGPONG or PATH has it), each with and without napper
# (NAPPERS threads napping 20 us) running beside it; the order of the two swaps every round.
# GPU machine, from the repository root, BUILD holding tandemd and tandem_cudart:
#   run(command="bash bench/experiments/round_trip/noise_ab.sh BUILD [ROUNDS] [COUNT] [NAPPERS]", carry=[".deps", ".scratch"])
set -u
BUILD=$1 ROUNDS=${2:-4} COUNT=${3:-20000} NAPPERS=${4:-4}
source bench/experiments/lib.sh
here=bench/experiments/round_trip
W=/tmp/noise-work
rm -rf "$W" && mkdir -p "$W"
nvcc -O2 -cudart shared -o "$W/sync_loop" $here/sync_loop.cu || exit 1
cc -O2 -o "$W/napper" $here/napper.c -lpthread || exit 1
experiment_env "$W"
declare -A addr
start_server_as tcp "$BUILD/server/tandemd" cuda "$W/tandemd.log" || exit 1
lib=$(find "$BUILD" -name libtandem-cudart.so | head -1)
ping=${FI_PINGPONG:-$(command -v fi_pingpong)}
measure() {  # one line of p50s
  local n t f=""
  n=$("$W/sync_loop" launch "$COUNT" | awk '{print $3}')
  t=$(LD_PRELOAD=$lib TANDEM_SERVERS=${addr[tcp]} "$W/sync_loop" launch "$COUNT" 2>/dev/null | grep -v '^\[tandem' | awk '{print $3}')
  if [[ -n $ping ]]; then
    local port=$(free_port)
    timeout 30 "$ping" -p net -e rdm -I 20000 -S 8 -B "$port" >/dev/null 2>&1 &
    sleep 0.5
    f=$(timeout 30 "$ping" -p net -e rdm -I 20000 -S 8 -P "$port" 127.0.0.1 2>/dev/null | awk 'NR == 2 { printf "%.2f", 2 * $7 }')
    wait
  fi
  echo "native $n tandem $t fi_pingpong(net, 8 B round trip) ${f:-n/a}"
}
for r in $(seq "$ROUNDS"); do
  order="off on"; ((r % 2 == 0)) && order="on off"
  for noise in $order; do
    if [[ $noise == on ]]; then "$W/napper" "$NAPPERS" 30 >"$W/napper.out" & nap=$!; fi
    echo "round $r noise $noise: $(measure)"
    if [[ $noise == on ]]; then kill $nap 2>/dev/null; wait $nap 2>/dev/null; fi
  done
done
