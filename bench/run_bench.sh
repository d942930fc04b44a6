#!/usr/bin/env bash
# Runs the benchmarks natively and through Tandem in the same run on this machine and
# prints `measurement | native | tandem | ratio ...`; writes table.txt, bench.json (and
# bench.png when python3 has matplotlib) to OUT_DIR. Ratios are printed, never asserted.
#   bash bench/run_bench.sh TANDEMD TANDEM BUILD_DIR [OUT_DIR]
# It starts `tandemd --backend cuda` (only with a GPU and a built cuda_bench) and
# `tandemd --backend opencl` servers on 127.0.0.1 (one for the main run, two for the
# server-to-server copy, four for the multi-device workloads) and stops them on exit.
# What it runs, for each API (natively, then through Tandem):
#   main run        launch, copy latency, bandwidth, idle read-back (one server)
#   --idle again   through Tandem with TANDEM_KEEPALIVE_MS=0 (keepalive off)
#   --idle-keepalive  natively, with the program's own thread keeping the GPU warm
#   --s2s           device 0 -> device 1 copy against a relay through the client (two
#                   servers; natively only with two devices, else n/a)
#   tandem(shm)     the Tandem half again over the shm provider (see TANDEM_BENCH_SHM)
#   workloads       examples/opencl/{advection,multi_matmul} (--devices 4, four servers; on a GPU also
#                   at n = 8192), advection also natively in four processes (bench/advection_procs)
#                   and
#                   examples/cuda/remd (one and two servers) when built; skipped otherwise. With one
#                   GPU, remd_2srv_mps again with both servers (and the native run) on NVIDIA's
#                   MPS, as the two servers would run on two GPUs (scripts/lib/mps.sh)
# and the raw fabric limit (tandem_fabric_pingpong) of each provider used, its round trip
# also after 0.1-100 ms of quiet with every thread on the path polling (--idle).
# Environment:
#   TANDEM_BENCH_QUICK=1        tiny repetition counts, sizes up to 1 MiB, no workloads
#                               and no shm column by default (the ctest bench_smoke)
#   TANDEM_FABRIC_PROVIDER      the provider of the Tandem column (default tcp)
#   TANDEM_BENCH_SHM=1|0        add (or leave out) the tandem(shm) column; default: on in
#                               full runs, off in quick runs; n/a when shm does not work
#   TANDEM_BENCH_ROUNDS=N       native and Tandem (tcp) runs of each program, alternating;
#                               each row is their median (default 3; 1 in quick runs), the
#                               idle read-backs with keepalive off and natively with one in
#                               the program, the shm column and the pingpong too
# Exit status: 0 when every main program ran, every output line parsed and the table
# printed. Rows that cannot be measured here (one device, a provider that is missing, a
# server-to-server path not there yet) are n/a with their reason and do not fail the run.
set -uo pipefail

if (($# < 3)); then
  echo "usage: $0 TANDEMD TANDEM BUILD_DIR [OUT_DIR]" >&2
  exit 2
fi
TANDEMD=$1 TANDEM=$2 BUILD=$3 OUT=${4:-$PWD/bench-out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../scripts/lib/tandemd.sh"
source "$HERE/../scripts/lib/mps.sh"
QUICK=${TANDEM_BENCH_QUICK:-0}
[[ $QUICK == 0 || -z $QUICK ]] && QUICK=0 || QUICK=1
export TANDEM_BENCH_QUICK=$QUICK
PROVIDER=${TANDEM_FABRIC_PROVIDER:-tcp}
SHM=${TANDEM_BENCH_SHM:-$((1 - QUICK))}
[[ $SHM == 0 || -z $SHM ]] && SHM=0 || SHM=1
[[ $PROVIDER == shm* ]] && SHM=0  # the Tandem column is shm already
log() { echo "run_bench: $*" >&2; }
failed=0
fail() { log "FAIL: $*"; failed=1; }

for f in "$TANDEMD" "$TANDEM"; do [[ -x $f ]] || { log "not built: $f"; exit 1; }; done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.txt "$OUT"/*.log "$OUT/bench.json" "$OUT/bench.png"
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-bench.XXXXXX")

server_pids=()
cleanup() {
  local pid
  for pid in "${server_pids[@]}"; do stop_tandemd "$pid"; done
  mps_stop
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The same environment for native and Tandem runs, except what `tandem run` sets.
# Keepalive is on (its default) unless a run turns it off.
unset TANDEM_SERVERS LD_PRELOAD OCL_ICD_VENDORS OCL_ICD_FILENAMES TANDEM_KEEPALIVE_MS
# Idle gaps of up to 100 ms must not look like a lost server.
export TANDEM_FAILOVER_TIMEOUT_MS=600000
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"
if ((QUICK)); then
  PING_IDLE="" RUN_TIMEOUT=60 PING_ITERS=200 WORK_TIMEOUT=60 S2S_LABEL=1MiB ROUNDS=${TANDEM_BENCH_ROUNDS:-1}
else
  PING_IDLE="--idle 1" RUN_TIMEOUT=600 PING_ITERS=10000 WORK_TIMEOUT=180 S2S_LABEL=256MiB ROUNDS=${TANDEM_BENCH_ROUNDS:-3}
fi

# Native OpenCL (NVIDIA's, else PoCL), both ICD loaders pinned to it.
source "$HERE/../scripts/lib/opencl-vendors.sh"
vendors=$(native_opencl_vendors "$work") || exit 1
ocl_libs=$(icd_libs "$vendors")
log "native OpenCL: $vendors ($ocl_libs)"

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep '^GPU' >/dev/null; then gpu=1; fi

# prov_env PROVIDER: the environment that makes tandemd, the client and the pingpong use it.
# shm's cross-memory attach needs ptrace rights that containers drop.
prov_env() {
  if [[ $1 == shm* ]]; then
    echo "TANDEM_FABRIC_PROVIDER=$1 FI_PROVIDER=shm FI_SHM_DISABLE_CMA=1"
  else
    echo "TANDEM_FABRIC_PROVIDER=$1"
  fi
}

# start_server BACKEND PROVIDER: starts one more tandemd on a free loopback port; sets $server.
# BACKEND cuda-mps: a CUDA server on MPS (mps_start first).
declare -A servers=()  # "backend provider" -> host:port,host:port,...
start_server() {
  local backend=$1 prov=$2 port pid name mps_env=""
  port=$(free_port)
  server=127.0.0.1:$port
  name=$backend-${prov//[^A-Za-z0-9]/_}-$port
  [[ $backend == *-mps ]] && mps_env=$MPS_ENV
  # shellcheck disable=SC2046,SC2086 # prov_env's words are separate assignments
  env $(prov_env "$prov") $mps_env OCL_ICD_VENDORS="$vendors" OCL_ICD_FILENAMES="$ocl_libs" \
    setsid "$TANDEMD" --listen "$server" --backend "${backend%-mps}" >"$OUT/tandemd-$name.log" 2>&1 &
  pid=$!
  server_pids+=("$pid")
  # Its own start-up line first: another program may hold free_port's port by now, and would
  # answer `tandem info` in our server's place.
  tandemd_listens "$pid" "$OUT/tandemd-$name.log" && for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    # shellcheck disable=SC2046
    if env $(prov_env "$prov") TANDEM_CONNECT_TIMEOUT_MS=2000 "$TANDEM" info --servers "$server" \
        >"$OUT/info-$name.txt" 2>/dev/null; then
      log "tandemd --backend $backend ($prov) on $server: $(head -n1 "$OUT/info-$name.txt")"
      return 0
    fi
    sleep 0.3
  done
  log "tandemd --backend $backend ($prov) did not come up; its log:"
  tail -20 "$OUT/tandemd-$name.log" >&2
  return 1
}

# need_servers BACKEND PROVIDER N: at least N servers of that kind; sets $list to N of them.
need_servers() {
  local key="$1 $2" have
  have=${servers[$key]:-}
  while (($(tr ',' '\n' <<<"$have" | grep -c .) < $3)); do
    start_server "$1" "$2" || return 1
    have=${have:+$have,}$server
    servers[$key]=$have
  done
  list=$(tr ',' '\n' <<<"$have" | head -n "$3" | paste -sd,)
}

# A line is `name value unit` or `name n/a reason`.
line_re='^[A-Za-z0-9_.]+ (-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)? (us|GB/s)|n/a .+)$'
# check FILE: every line parses, and there is at least one.
check() {
  local bad
  if [[ ! -s $1 ]]; then fail "$1: no measurements"; return 1; fi
  bad=$(grep -cvE "$line_re" "$1")
  if ((bad > 0)); then fail "$1: $bad unparsable line(s)"; grep -vE "$line_re" "$1" | head -5 >&2; return 1; fi
}

# run_native NAME PROGRAM ARGS...: stdout to NAME.txt, stderr to NAME.log; with the
# assignments in NATIVE_ENV when a caller sets it.
NATIVE_ENV=""
run_native() {
  local name=$1; shift
  # shellcheck disable=SC2086
  env $NATIVE_ENV OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$ocl_libs timeout -k 5 "$RUN_TIMEOUT" "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.log"
}
# run_tandem NAME PROVIDER SERVERS RUNFLAGS PROGRAM ARGS...: the same through `tandem run`
# (variables assigned before the call reach the program).
run_tandem() {
  local name=$1 prov=$2 srv=$3 flags=$4; shift 4
  # shellcheck disable=SC2046,SC2086
  env $(prov_env "$prov") timeout -k 5 "$RUN_TIMEOUT" "$TANDEM" run $flags --servers "$srv" -- "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.log"
}
# reason NAME STATUS: one line saying why a run failed, for n/a rows.
reason() {
  local last
  last=$(grep -v '^\s*$' "$OUT/$1.log" 2>/dev/null | tail -n1 | tr -d '\r' | cut -c1-160)
  if (($2 == 124 || $2 == 137)); then echo "timed out after ${RUN_TIMEOUT}s"; else echo "exit $2${last:+: $last}"; fi
}
# na_file NAME WHY ROW...: NAME.txt with an n/a line for each row.
na_file() {
  local name=$1 why=$2 row; shift 2
  for row; do echo "$row n/a $why"; done >"$OUT/$name.txt"
}

# median_rows NAME: NAME.txt becomes, row by row, the median of NAME.txt and its extra
# rounds NAME.rN.txt (rows a round lacks, or has as n/a, count without it). The first round
# is kept as NAME.r1.txt.
median_rows() {
  local name=$1
  compgen -G "$OUT/$name.r[0-9]*.txt" >/dev/null || return 0
  cp "$OUT/$name.txt" "$OUT/$name.r1.txt"
  python3 - "$OUT/$name.txt" "$OUT/$name".r[0-9]*.txt <<'PY'
import statistics, sys
out, files = sys.argv[1], sys.argv[2:]
rows, values = [], {}
for path in files:
    for line in open(path):
        parts = line.split()
        if len(parts) < 3:
            continue
        name = parts[0]
        if name not in values:
            rows.append(name)
            values[name] = ([], line.rstrip("\n"), parts[2])
        if parts[1] != "n/a":
            values[name][0].append(float(parts[1]))
with open(out, "w") as f:
    for name in rows:
        vals, first, unit = values[name]
        print(f"{name} {statistics.median(vals):.4f} {unit}" if vals else first, file=f)
PY
}

# drop_round NAME RC: an extra round that failed counts for nothing (the median is of the
# others); said in the log.
drop_round() {
  log "$1 failed ($(reason "$1" "$2")): left out of the medians"
  rm -f "$OUT/$1.txt"
}

# bench API BACKEND PREFIX PROGRAM RUNFLAGS: every run of one benchmark program.
bench() {
  local api=$1 backend=$2 prefix=$3 prog=$4 flags=$5 rc s2s_rows list r
  s2s_rows=("${prefix}_s2s_copy_$S2S_LABEL" "${prefix}_relay_copy_$S2S_LABEL")
  log "$api: native"
  run_native "$api-native" "$prog"; rc=$?
  if ((rc)); then fail "$api natively: $(reason "$api-native" $rc)"; return 1; fi
  check "$OUT/$api-native.txt" || return 1

  if need_servers "$backend" "$PROVIDER" 1; then
    log "$api: through Tandem ($PROVIDER, $list)"
    run_tandem "$api-tandem" "$PROVIDER" "$list" "$flags" "$prog"; rc=$?
    if ((rc)); then fail "$api through Tandem: $(reason "$api-tandem" $rc)"
    else
      check "$OUT/$api-tandem.txt"
      # On a machine whose own costs drift from minute to minute, one native run against one
      # Tandem run a minute later says little: more rounds, alternating, and the median.
      for ((r = 2; r <= ROUNDS; ++r)); do
        log "$api: round $r of $ROUNDS, natively and through Tandem"
        run_native "$api-native.r$r" "$prog" || drop_round "$api-native.r$r" $?
        run_tandem "$api-tandem.r$r" "$PROVIDER" "$list" "$flags" "$prog" || drop_round "$api-tandem.r$r" $?
      done
      median_rows "$api-native" || fail "$api: the rounds' medians natively"
      median_rows "$api-tandem" || fail "$api: the rounds' medians through Tandem"
      check "$OUT/$api-native.txt" && check "$OUT/$api-tandem.txt"
    fi
    log "$api: idle read-back through Tandem with keepalive off"
    TANDEM_KEEPALIVE_MS=0 run_tandem "$api-tandem-ka0" "$PROVIDER" "$list" "$flags" "$prog" --idle; rc=$?
    if ((rc)); then fail "$api with keepalive off: $(reason "$api-tandem-ka0" $rc)"
    else
      for ((r = 2; r <= ROUNDS; ++r)); do
        TANDEM_KEEPALIVE_MS=0 run_tandem "$api-tandem-ka0.r$r" "$PROVIDER" "$list" "$flags" "$prog" --idle ||
          drop_round "$api-tandem-ka0.r$r" $?
      done
      median_rows "$api-tandem-ka0" || fail "$api: the rounds' medians with keepalive off"
      check "$OUT/$api-tandem-ka0.txt"
    fi
    # What a keepalive can do with no network in the path: the program's own thread keeps the
    # GPU warm as tandemd's would. Tandem's warm read plus this run's idle cost is as low as an
    # idle read-back through Tandem can be expected to go (report.py's "bound" column).
    log "$api: idle read-back natively, with a keepalive inside the program"
    run_native "$api-native-ka" "$prog" --idle-keepalive; rc=$?
    if ((rc)); then fail "$api natively with a keepalive: $(reason "$api-native-ka" $rc)"
    else
      for ((r = 2; r <= ROUNDS; ++r)); do
        run_native "$api-native-ka.r$r" "$prog" --idle-keepalive || drop_round "$api-native-ka.r$r" $?
      done
      median_rows "$api-native-ka" || fail "$api: the rounds' medians natively with a keepalive"
      check "$OUT/$api-native-ka.txt"
    fi
  else
    fail "no $backend server ($PROVIDER)"
  fi

  log "$api: device-to-device copy, natively"
  run_native "$api-s2s-native" "$prog" --s2s; rc=$?
  ((rc)) && na_file "$api-s2s-native" "($(reason "$api-s2s-native" $rc))" "${s2s_rows[@]}"
  check "$OUT/$api-s2s-native.txt"
  if need_servers "$backend" "$PROVIDER" 2; then
    log "$api: server-to-server copy through Tandem ($list)"
    run_tandem "$api-s2s-tandem" "$PROVIDER" "$list" "$flags" "$prog" --s2s; rc=$?
    ((rc)) && na_file "$api-s2s-tandem" "($(reason "$api-s2s-tandem" $rc))" "${s2s_rows[@]}"
  else
    na_file "$api-s2s-tandem" "(two $PROVIDER servers did not start)" "${s2s_rows[@]}"
  fi
  check "$OUT/$api-s2s-tandem.txt"

  ((SHM)) || return 0
  if ((shm_ok)) && need_servers "$backend" shm 2; then
    local one=${list%%,*}
    log "$api: through Tandem over shm ($one)"
    run_tandem "$api-shm" shm "$one" "$flags" "$prog"; rc=$?
    if ((rc)); then echo "# n/a ($(reason "$api-shm" $rc))" >"$OUT/$api-shm.txt"
    else
      for ((r = 2; r <= ROUNDS; ++r)); do
        log "$api: round $r of $ROUNDS over shm"
        run_tandem "$api-shm.r$r" shm "$one" "$flags" "$prog" || drop_round "$api-shm.r$r" $?
      done
      median_rows "$api-shm" || fail "$api: the rounds' medians over shm"
    fi
    log "$api: server-to-server copy through Tandem over shm ($list)"
    run_tandem "$api-s2s-shm" shm "$list" "$flags" "$prog" --s2s; rc=$?
    ((rc)) && na_file "$api-s2s-shm" "($(reason "$api-s2s-shm" $rc))" "${s2s_rows[@]}"
  else
    # Once is enough: do not wait for a failing shm server again for the next API.
    ((shm_ok)) && shm_ok=0 shm_why="shm tandemd did not start (see $OUT/tandemd-*-shm-*.log)"
    echo "# n/a ($shm_why)" >"$OUT/$api-shm.txt"
    na_file "$api-s2s-shm" "($shm_why)" "${s2s_rows[@]}"
  fi
  check "$OUT/$api-s2s-shm.txt"
  return 0
}

# Does libfabric offer shm here? (The runs report n/a if it still fails.)
shm_ok=0 shm_why=""
if ((SHM)); then
  if ! command -v fi_info >/dev/null; then shm_ok=1  # cannot ask: just try
  elif FI_PROVIDER=shm fi_info -p shm >/dev/null 2>&1; then shm_ok=1
  else shm_why="libfabric offers no shm provider (fi_info -p shm)"; log "$shm_why"
  fi
fi

apis=()
if ((gpu)) && [[ -x $BUILD/bench/cuda_bench ]]; then
  bench cuda cuda cuda "$BUILD/bench/cuda_bench" "" && apis+=(cuda)
elif ((gpu)); then
  fail "GPU present but $BUILD/bench/cuda_bench not built (nvcc missing?)"
else
  log "cuda: skipped (no GPU)"
fi
if [[ -x $BUILD/bench/opencl_bench ]]; then
  bench opencl opencl ocl "$BUILD/bench/opencl_bench" --no-cuda && apis+=(opencl)
else
  fail "not built: $BUILD/bench/opencl_bench"
fi

# Workloads (examples that print `time: X s`): native and through Tandem, when built.
# workload NAME BACKEND SERVERS RUNFLAGS PROGRAM ARGS...
: >"$OUT/workloads.txt"
workload() {
  local name=$1 backend=$2 n=$3 flags=$4 rc; shift 4
  [[ -x $1 ]] || return 0
  local RUN_TIMEOUT=$WORK_TIMEOUT
  log "workload $name: native"
  local NATIVE_ENV=""  # run_native's, for this call
  [[ $backend == *-mps ]] && NATIVE_ENV=$MPS_ENV
  run_native "work-$name-native" "$@"; rc=$?
  local nat_why="" tan_why=""
  ((rc)) && nat_why="($(reason "work-$name-native" $rc))"
  if need_servers "$backend" "$PROVIDER" "$n"; then
    log "workload $name: through Tandem ($n servers)"
    run_tandem "work-$name-tandem" "$PROVIDER" "$list" "$flags" "$@"; rc=$?
    ((rc)) && tan_why="($(reason "work-$name-tandem" $rc))"
  else
    tan_why="($n $backend servers did not start)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$n" "$nat_why" "$tan_why" >>"$OUT/workloads.txt"
}
# procs_baseline NAME ARGS...: the advection row NAME again natively, its bands in four
# processes sharing the device (bench/advection_procs.c): what four programs on one GPU get
# without Tandem, where four tandemd share it. Report column "native, 4 processes".
procs_baseline() {
  local name=$1 rc why=""; shift
  [[ -x $BUILD/bench/advection_procs ]] || return 0
  local RUN_TIMEOUT=$WORK_TIMEOUT NATIVE_ENV=""
  log "workload $name: native, four processes"
  run_native "work-$name-procs" "$BUILD/bench/advection_procs" --procs 4 "$@"; rc=$?
  ((rc)) && why="($(reason "work-$name-procs" $rc))"
  printf '%s\t%s\n' "$name" "$why" >>"$OUT/workloads-procs.txt"
}
: >"$OUT/workloads-procs.txt"
if ((QUICK)); then
  log "workloads: skipped in quick mode"
else
  workload advection_4dev opencl 4 --no-cuda "$BUILD/examples/opencl/advection" --devices 4
  procs_baseline advection_4dev
  workload multi_matmul_4dev opencl 4 --no-cuda "$BUILD/examples/opencl/multi_matmul" --devices 4
  if ((gpu)); then
    # The same split at sizes a user would spread over four GPUs: at the default sizes a whole
    # native run takes milliseconds and per-step round trips decide the ratio.
    workload advection_4dev_n8192 opencl 4 --no-cuda "$BUILD/examples/opencl/advection" --devices 4 --n 8192 \
      --steps 200 --no-check
    procs_baseline advection_4dev_n8192 --n 8192 --steps 200
    workload advection_4dev_n16384 opencl 4 --no-cuda "$BUILD/examples/opencl/advection" --devices 4 --n 16384 \
      --steps 100 --no-check
    procs_baseline advection_4dev_n16384 --n 16384 --steps 100
    workload multi_matmul_4dev_n8192 opencl 4 --no-cuda "$BUILD/examples/opencl/multi_matmul" --devices 4 --n 8192
    workload remd cuda 1 "" "$BUILD/examples/cuda/remd"
    workload remd_2srv cuda 2 "" "$BUILD/examples/cuda/remd"
    if (($(nvidia-smi -L | grep -c '^GPU') == 1)) && mps_start; then
      workload remd_2srv_mps cuda-mps 2 "" "$BUILD/examples/cuda/remd"
    fi
  fi
fi

# The raw fabric limit of each provider used, same host, no GPU API: ROUNDS runs, whose
# medians report.py takes (fabric-K.txt, fabric-K.rN.txt).
PING=$BUILD/fabric/tandem_fabric_pingpong
pingpong() {
  local prov=$1 rc r name
  for ((r = 1; r <= ROUNDS; ++r)); do
    name=fabric-$2; ((r > 1)) && name+=.r$r
    # shellcheck disable=SC2046
    env $(prov_env "$prov") timeout -k 5 "$RUN_TIMEOUT" "$PING" --provider "$prov" --iters "$PING_ITERS" $PING_IDLE \
      >"$OUT/$name.txt" 2>"$OUT/$name.log"; rc=$?
    ((rc == 0)) && continue
    if ((r == 1)); then
      echo "n/a ($(reason "$name" $rc))" >"$OUT/$name.txt"
      return 1
    fi
    drop_round "$name" $rc
  done
}
if [[ -x $PING ]]; then
  pingpong "$PROVIDER" tandem || fail "tandem_fabric_pingpong ($PROVIDER): $(cat "$OUT/fabric-tandem.txt")"
  if ((SHM)); then
    if ((shm_ok)); then pingpong shm shm || log "tandem_fabric_pingpong (shm): $(cat "$OUT/fabric-shm.txt")"
    else echo "n/a ($shm_why)" >"$OUT/fabric-shm.txt"; fi
  fi
else
  fail "not built: $PING"
fi

# The provider alone: libfabric's own fi_pingpong (package libfabric-bin; FI_PINGPONG names
# another), one thread per side busy-polling its CQ, where it is installed. Beside
# tandem_fabric_pingpong it shows what Tandem's fabric layer adds to the round trip. It prints
# half a round trip, averaged: fabric-raw-K.txt holds the round trip (x2), 8 B and 256 B (above
# rxm's inject size, as Tandem's batches are).
FPP=${FI_PINGPONG:-$(command -v fi_pingpong || true)}
raw_pingpong() {  # raw_pingpong PROVIDER KEY
  local prov=$1 r size port srv half name stack
  # The stack Tandem's layer got (tandem_fabric_pingpong's first line): "tcp" is `net` on
  # libfabric 1.17 where it is offered, else tcp;ofi_rxm, which fi_pingpong -p tcp -e rdm gets.
  stack=$(sed -n '1s/^provider \([^ ]*\) (libfabric.*/\1/p' "$OUT/fabric-$2.txt" 2>/dev/null)
  [[ -n $stack ]] && prov=$stack
  [[ $prov == tcp* ]] && prov=tcp
  for ((r = 1; r <= ROUNDS; ++r)); do
    name=fabric-raw-$2; ((r > 1)) && name+=.r$r
    : >"$OUT/$name.txt"
    for size in 8 256; do
      port=$(free_port)
      # shellcheck disable=SC2046
      env $(prov_env "$1") timeout -k 5 60 "$FPP" -p "$prov" -e rdm -I 20000 -S $size -B "$port" \
        >/dev/null 2>>"$OUT/$name.log" &
      srv=$!
      sleep 0.5
      # shellcheck disable=SC2046
      half=$(env $(prov_env "$1") timeout -k 5 60 "$FPP" -p "$prov" -e rdm -I 20000 -S $size -P "$port" 127.0.0.1 \
        2>>"$OUT/$name.log" | awk 'NR == 2 { print $7 }')
      wait $srv 2>/dev/null
      [[ -n $half ]] && awk -v s=$size -v h="$half" 'BEGIN { printf "fi_pingpong %s B round trip: mean %.2f us\n", s, 2 * h }' \
        >>"$OUT/$name.txt"
    done
    [[ -s $OUT/$name.txt ]] || echo "n/a (fi_pingpong failed: $(tail -1 "$OUT/$name.log" 2>/dev/null))" >"$OUT/$name.txt"
  done
}
if [[ -x $FPP ]]; then
  raw_pingpong "$PROVIDER" tandem
  if ((SHM)) && ((shm_ok)); then raw_pingpong shm shm; fi
else
  log "fi_pingpong not found (package libfabric-bin): the table shows no provider-alone round trip"
fi

# The table and bench.json.
python3 "$HERE/report.py" --out "$OUT" --quick "$QUICK" --gpu "$gpu" --provider "$PROVIDER" --shm "$SHM" \
  --host "$(hostname)" --apis "${apis[*]:-}" | tee "$OUT/table.txt"
((${PIPESTATUS[0]} == 0)) || fail "report.py failed"

if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$HERE/plot.py" "$OUT/bench.json" "$OUT/bench.png" || log "plot.py failed (chart skipped)"
fi

((${#apis[@]})) || fail "no benchmark compared"
log "${#apis[@]} benchmark(s) compared (${apis[*]:-none}); table.txt, bench.json in $OUT"
exit "$failed"
