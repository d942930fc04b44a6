#!/usr/bin/env bash
# poll-mode experiment: tandem_fabric_pingpong in two processes, TANDEM_FABRIC_POLL 0/1/2, tcp and shm, rounds interleaved.
PP=$1; ROUNDS=${2:-3}
export FI_SHM_DISABLE_CMA=1
port=48100
for r in $(seq $ROUNDS); do
  for prov in tcp shm; do
    line="round $r $prov:"
    for m in ${MODES:-0 1 2 3}; do
      port=$((port+1))
      TANDEM_FABRIC_POLL=$m timeout 60 $PP --provider $prov --listen 127.0.0.1:$port >/dev/null 2>&1 & srv=$!
      sleep 0.5
      v=$(TANDEM_FABRIC_POLL=$m timeout 60 $PP --provider $prov --connect 127.0.0.1:$port --iters 10000 --size 200 2>/dev/null | awk '$1 == "200" && $8 == "(interleaved" { print $13 "/" $6 }')
      kill $srv 2>/dev/null; wait $srv 2>/dev/null
      line+="  mode$m 8B/200B $v"
    done
    echo "$line"
  done
done
