# shellcheck shell=bash
# Sourced by the A/B and idle read-back experiments (idle_ab.sh, opencl_flush_ab.sh,
# keepalive_interval.sh): two builds to compare, tandemd
# servers on loopback that use this machine's own OpenCL (NVIDIA's on the GPU machine), and
# the rows of cuda_bench / opencl_bench --idle on one line.
source scripts/lib/tandemd.sh
source scripts/lib/opencl-vendors.sh

# build_tree SRC OUT LOGDIR NAME TARGETS [CMAKE ARGS...]: configures and builds TARGETS
# (space-separated) of the tree at SRC into OUT, logs in LOGDIR/{cfg,build}-NAME.log.
build_tree() {
  local src=$1 out=$2 logs=$3 name=$4 targets=$5
  shift 5
  # shellcheck disable=SC2086 # TARGETS is a list
  cmake -S "$src" -B "$out" -G Ninja -DTANDEM_WERROR=OFF "$@" >"$logs/cfg-$name.log" 2>&1 &&
    ninja -C "$out" $targets >"$logs/build-$name.log" 2>&1 ||
    { grep -E "error|FAILED" "$logs/build-$name.log" "$logs/cfg-$name.log" | head -20; return 1; }
}

# unpack_tree TAR DIR: a `git archive` tarball into DIR (emptied first), with the working
# tree's .deps (the CL headers).
unpack_tree() {
  rm -rf "$2" && mkdir -p "$2" && tar -xf "$1" -C "$2" || return 1
  cp -r .deps "$2/" 2>/dev/null
  return 0
}

# build_ab BASE_TAR PREFIX TARGETS [CMAKE ARGS...]: builds TARGETS of the working tree into
# PREFIX-new and of the base tarball (unpacked into PREFIX-base-src) into PREFIX-base, logs
# in PREFIX-work, which it empties first. Sets N, B and W to those.
build_ab() {
  local tar=$1 prefix=$2 targets=$3
  shift 3
  N=$prefix-new B=$prefix-base W=$prefix-work
  rm -rf "$W" && mkdir -p "$W" && unpack_tree "$tar" "$prefix-base-src" || return 1
  build_tree . "$N" "$W" new "$targets" "$@" && build_tree "$prefix-base-src" "$B" "$W" base "$targets" "$@"
}

# experiment_env WORKDIR: the native OpenCL's vendors and libraries, a PoCL cache, and no
# lost-server verdict across the 100 ms gaps.
experiment_env() {
  vendors=$(native_opencl_vendors "$1") || exit 1
  libs=$(icd_libs "$vendors")
  export POCL_CACHE_DIR=$1/pocl TANDEM_FAILOVER_TIMEOUT_MS=600000
  mkdir -p "$POCL_CACHE_DIR"
  pids=()
  trap stop_experiment_servers EXIT
}

# start_experiment_server TANDEMD BACKEND LOG: one more tandemd; prints its address.
start_experiment_server() {
  local port
  port=$(free_port)
  OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$1" --listen 127.0.0.1:$port --backend "$2" >"$3" 2>&1 &
  pids+=($!)
  tandemd_listens "$!" "$3" || { echo "tandemd ($2) did not start: $(tail -1 "$3")" >&2; return 1; }
  echo 127.0.0.1:$port
}

# start_server_as KEY TANDEMD BACKEND LOG: start_experiment_server, its address going to
# addr[KEY] (the caller's associative array).
start_server_as() {
  # Not $(...): the server must stay this shell's child for the cleanup.
  start_experiment_server "$2" "$3" "$4" >"$W/addr"
  addr[$1]=$(cat "$W/addr")
}

# start_tree_servers TREE BUILD: one CUDA and one OpenCL tandemd of BUILD (logs in $W); their
# addresses go to addr[TREE-cuda] and addr[TREE-opencl].
start_tree_servers() {
  local backend
  for backend in cuda opencl; do start_server_as "$1-$backend" "$2/server/tandemd" $backend "$W/tandemd-$1-$backend.log"; done
}

# ab_build TREE: the build of tree new or base (build_ab's $N or $B).
ab_build() { if [[ $1 == base ]]; then echo "$B"; else echo "$N"; fi; }

# start_ab_servers BACKEND: one tandemd of BACKEND from each of build_ab's builds; their
# addresses go to addr[new] and addr[base].
start_ab_servers() {
  local tree
  for tree in new base; do start_server_as $tree "$(ab_build $tree)/server/tandemd" "$1" "$W/tandemd-$tree.log"; done
}

stop_experiment_servers() {
  local pid
  for pid in "${pids[@]}"; do stop_tandemd "$pid"; done
}

idle_rows() { sed 's/ocl_readback_//;s/cuda_readback_//;s/idle_//' | awk '/readback|^warm|ms /{printf "%s %.1f  ", $1, $2}'; }

# run_summary OUTPUT: a 4-device workload run's output (advection or multi_matmul) as "TIME
# DIGEST": its ms/step (advection) or seconds (multi_matmul) and a digest of its result lines,
# which must agree between runs of one size; or FAILED(its last lines).
run_summary() {
  local t sum
  t=$(sed -n 's/^time: .*(\([0-9.]*\) ms\/step).*/\1/p; s/^time: \([0-9.]*\) s.*/\1/p' <<<"$1" | head -1)
  sum=$(grep -E '^(advection: checksum|multi_matmul:)' <<<"$1" | grep -v time | md5sum | cut -c1-8)
  if [[ -z $t ]]; then echo "FAILED($(tail -2 <<<"$1" | tr '\n' ' '))"; else echo "$t $sum"; fi
}

# workload_rows: the 4-device A/B rows into the array `rows`: advection at each of SIZES (env,
# ';'-separated advection arguments; three sizes by default), then multi_matmul at n = 8192.
workload_rows() {
  local size sizes
  IFS=';' read -r -a sizes <<<"${SIZES:-"--n 1024 --steps 200;--n 8192 --steps 100;--n 16384 --steps 50"}"
  rows=()
  for size in "${sizes[@]}"; do rows+=("advection $size --no-check"); done
  rows+=("multi_matmul --n 8192")
}

# four_advection_servers BUILD_DIR LOG_PREFIX: the 4-server advection experiments' start
# (opencl_processes.sh, opencl_4srv_profile.sh, opencl_4srv_trace.sh): builds what they run
# into BUILD_DIR (not with NO_BUILD=1: BUILD_DIR is built already), logs in W=BUILD_DIR-work,
# experiment_env, and four OpenCL tandemd with the caller's environment (logs
# $W/LOG_PREFIX-{0..3}.log); their addresses go to addr[s0..s3] and, as one list, to $four.
# PER_GPU=1 (env): server i sees GPU i modulo the GPUs there alone (CUDA_VISIBLE_DEVICES).
four_advection_servers() {
  local bld=$1 prefix=$2 i gpus
  W=$bld-work
  mkdir -p "$W"
  if [[ ${NO_BUILD:-0} != 1 ]]; then
    build_tree . "$bld" "$W" procs "tandemd tandem tandem_opencl advection advection_procs" \
      -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
  fi
  experiment_env "$W"
  declare -gA addr
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  ((gpus > 0)) || gpus=1
  for i in 0 1 2 3; do
    if [[ ${PER_GPU:-0} == 1 ]]; then
      CUDA_VISIBLE_DEVICES=$((i % gpus)) start_server_as "s$i" "$bld/server/tandemd" opencl "$W/$prefix-$i.log"
    else
      start_server_as "s$i" "$bld/server/tandemd" opencl "$W/$prefix-$i.log"
    fi
  done
  four=${addr[s0]},${addr[s1]},${addr[s2]},${addr[s3]}
  sleep 2
}
