#!/usr/bin/env bash
# A/B of one client setting on the synchronous loops (GPU machine, from the repository root,
# after a build): sync_loop (CUDA) and ocl_loop (OpenCL) natively, then through one tandemd
# per API with and without SETTING, interleaved, ROUNDS times, over each provider given.
# Prints one line per run: "provider round variant program: <the loop's own p50 line>".
#   bash bench/experiments/round_trip/ab_env.sh BUILD_DIR TANDEM_EXP_EAGER=0 [ROUNDS] [PROVIDERS]
# e.g. ... /tmp/tgX TANDEM_EXP_EAGER=0 3 "tcp shm". The B side runs with SETTING, the A side
# without it.
set -u
B=$1 setting=$2 rounds=${3:-3} providers=${4:-tcp shm}
here=bench/experiments/round_trip
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh
W=/tmp/ab-env
mkdir -p $W
export POCL_CACHE_DIR=$W/pocl
mkdir -p "$POCL_CACHE_DIR"
gcc -O2 -I.deps/include -o $W/ocl_loop $here/ocl_loop.c -lOpenCL &&
  nvcc -O2 -cudart shared -o $W/sync_loop $here/sync_loop.cu || exit 1
vendors=$(native_opencl_vendors $W) || exit 1
libs=$(icd_libs "$vendors")
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs
loops=("sync_loop launch" "sync_loop split" "sync_loop read" "sync_loop async" "ocl_loop launch" "ocl_loop read" "ocl_loop async")

for prov in $providers; do
  env=(TANDEM_FABRIC_PROVIDER=$prov)
  [[ $prov == shm ]] && env+=(FI_PROVIDER=shm FI_SHM_DISABLE_CMA=1)
  declare -A srv=()
  pids=()
  for backend in cuda opencl; do
    p=$(free_port)
    env "${env[@]}" setsid "$B/server/tandemd" --listen 127.0.0.1:$p --backend $backend >$W/tandemd-$backend-$prov.log 2>&1 &
    pids+=($!)
    tandemd_listens $! $W/tandemd-$backend-$prov.log || { echo "tandemd $backend ($prov) did not start"; tail -5 $W/tandemd-$backend-$prov.log; exit 1; }
    srv[$backend]=127.0.0.1:$p
  done
  env "${env[@]}" timeout 60 "$B/fabric/tandem_fabric_pingpong" --provider $prov --iters 3000 2>/dev/null | grep "round trip" | sed "s/^/$prov wire: /"
  for ((r = 1; r <= rounds; ++r)); do
    for l in "${loops[@]}"; do
      set -- $l
      backend=cuda; [[ $1 == ocl_loop ]] && backend=opencl
      ((r == 1)) && echo "$prov $r native $l: $(timeout 60 $W/$1 $2)"
      # A, then B; the next round starts with B, so neither side always runs first.
      order=(A B); ((r % 2 == 0)) && order=(B A)
      for v in "${order[@]}"; do
        extra=(); [[ $v == B ]] && extra=("$setting")
        echo "$prov $r $v $l: $(env "${env[@]}" "${extra[@]}" timeout 120 "$B/tools/tandem" run --servers ${srv[$backend]} -- $W/$1 $2 2>&1 | grep -v '^\[tandem' | tail -1)"
      done
    done
  done
  for pid in "${pids[@]}"; do stop_tandemd $pid; done
done
