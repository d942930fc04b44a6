#!/usr/bin/env bash
# The raw provider's round trip against Tandem's fabric layer on the same host (GPU machine
# or any, from the repository root): libfabric's own fi_pingpong (one thread per side,
# busy-polling the CQ; reports half a mean round trip, doubled here) beside
# tandem_fabric_pingpong (through tandem::fabric::Endpoint: its framing, and who reads the CQ:
# the progress thread until e37eaf3, the thread in Next() since), both in two processes, tcp
# and shm, 8 B and 200 B
# (Tandem's launch + synchronize batch is larger than the rxm inject size of 64 B), ROUNDS
# interleaved rounds. FI_PINGPONG: the fi_pingpong binary (libfabric-bin; default: PATH).
#   bash bench/experiments/raw_wire.sh BUILD_DIR [ROUNDS]
set -u
B=${1:?usage: raw_wire.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-3}
FPP=${FI_PINGPONG:-$(command -v fi_pingpong)}
[[ -x $FPP ]] || { echo "no fi_pingpong"; exit 1; }
PP=$B/fabric/tandem_fabric_pingpong
export FI_SHM_DISABLE_CMA=1
port=47900
fi_rt() {  # fi_rt PROVIDER SIZE [MODE]: the mean round trip over 20000, in us
  port=$((port + 1))
  timeout 60 "$FPP" -p "$1" -e rdm -I 20000 -S "$2" -m "${3:-msg}" -B $port >/dev/null 2>&1 &
  sleep 0.5
  local half
  half=$(timeout 60 "$FPP" -p "$1" -e rdm -I 20000 -S "$2" -m "${3:-msg}" -P $port 127.0.0.1 2>/dev/null | awk 'NR==2 {print $7}')
  wait
  awk -v h="${half:-nan}" 'BEGIN { if (h == "nan") print "failed"; else printf "%.1f", 2 * h }'
}
tandem_rt() {  # tandem_rt PROVIDER SIZE: p50 round trip in us, two processes
  port=$((port + 1))
  local addr=127.0.0.1:$port
  timeout 60 "$PP" --provider "$1" --listen "$addr" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  timeout 60 "$PP" --provider "$1" --connect "$addr" --iters 10000 --size "$2" 2>/dev/null |
    awk -v s="$2" '$1 == s && $2 == "B" && $8 == "(interleaved" { print $6 }'
  kill $srv 2>/dev/null
  wait $srv 2>/dev/null
}
for r in $(seq "$ROUNDS"); do
  for prov in tcp shm; do
    line="round $r $prov:"
    for s in 8 200; do
      line+="  fi_pingpong ${s}B $(fi_rt $prov $s)"
      [[ $prov == tcp ]] && line+="  fi_pingpong tagged ${s}B $(fi_rt $prov $s tagged)"
      line+="  tandem ${s}B $(tandem_rt $prov $s)"
    done
    echo "$line"
  done
done
