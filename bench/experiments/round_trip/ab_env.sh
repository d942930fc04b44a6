#!/usr/bin/env bash
# A/B of one client setting, or of two builds, on the synchronous loops (GPU machine, from the
# repository root, after a build): sync_loop (CUDA) and ocl_loop (OpenCL) natively, then
# through tandemd (one per API and side) for A and B, interleaved, ROUNDS times, over each
# provider given. Prints one line per run: "provider round variant program: <the loop's p50 line>".
#   bash bench/experiments/round_trip/ab_env.sh BUILD_DIR TANDEM_EXP_EAGER=0 [ROUNDS] [PROVIDERS]
#   bash bench/experiments/round_trip/ab_env.sh BASE_BUILD_DIR build=NEW_BUILD_DIR [ROUNDS] [PROVIDERS]
# e.g. ... /tmp/tgX TANDEM_EXP_EAGER=0 3 "tcp shm". The B side runs with SETTING (the A side
# without it), or with the other build's tandemd and client.
# AB_LOOPS="ocl_loop launch 1000;ocl_loop read 1000" runs only those loops (";"-separated, with
# their arguments). AB_PIN=SERVER_CPUS:CLIENT_CPUS (e.g. 2-5:8-11) pins the tandemd servers and
# the programs to those CPUs (taskset), for both sides alike: which CPUs a run's threads land
# on moved a loop's p50 by up to 10 us from one process to the next (2026-11-27-g.md).
set -u
B=$1 setting=$2 rounds=${3:-3} providers=${4:-tcp shm}
declare -A build=([A]=$B [B]=$B) extra_env=([A]="" [B]=$setting)
if [[ $setting == build=* ]]; then
  build[B]=${setting#build=}
  extra_env[B]=""
fi
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
[[ -n ${AB_LOOPS:-} ]] && IFS=';' read -r -a loops <<<"$AB_LOOPS"
pin_server=() pin_client=()
if [[ -n ${AB_PIN:-} ]]; then
  pin_server=(taskset -c "${AB_PIN%%:*}") pin_client=(taskset -c "${AB_PIN#*:}")
fi

for prov in $providers; do
  env=(TANDEM_FABRIC_PROVIDER=$prov)
  [[ $prov == shm ]] && env+=(FI_PROVIDER=shm FI_SHM_DISABLE_CMA=1)
  declare -A srv=()
  pids=()
  for v in A B; do
    [[ $v == B && ${build[B]} == "${build[A]}" ]] && { srv[B-cuda]=${srv[A-cuda]}; srv[B-opencl]=${srv[A-opencl]}; continue; }
    for backend in cuda opencl; do
      p=$(free_port)
      log=$W/tandemd-$v-$backend-$prov.log
      env "${env[@]}" setsid "${pin_server[@]}" "${build[$v]}/server/tandemd" --listen 127.0.0.1:$p --backend $backend >$log 2>&1 &
      pids+=($!)
      tandemd_listens $! $log || { echo "tandemd $v $backend ($prov) did not start"; tail -5 $log; exit 1; }
      srv[$v-$backend]=127.0.0.1:$p
    done
  done
  env "${env[@]}" timeout 60 "$B/fabric/tandem_fabric_pingpong" --provider $prov --iters 3000 2>/dev/null | grep "round trip" | sed "s/^/$prov wire: /"
  for ((r = 1; r <= rounds; ++r)); do
    for l in "${loops[@]}"; do
      set -- $l
      backend=cuda; [[ $1 == ocl_loop ]] && backend=opencl
      ((r == 1)) && echo "$prov $r native $l: $(timeout 60 "${pin_client[@]}" $W/$1 "${@:2}")"
      # A, then B; the next round starts with B, so neither side always runs first.
      order=(A B); ((r % 2 == 0)) && order=(B A)
      for v in "${order[@]}"; do
        extra=(); [[ -n ${extra_env[$v]} ]] && extra=("${extra_env[$v]}")
        echo "$prov $r $v $l: $(env "${env[@]}" "${extra[@]}" timeout 120 "${pin_client[@]}" "${build[$v]}/tools/tandem" run --servers ${srv[$v-$backend]} -- $W/$1 "${@:2}" 2>&1 | grep -v '^\[tandem' | tail -1)"
      done
    done
  done
  for pid in "${pids[@]}"; do stop_tandemd $pid; done
done
