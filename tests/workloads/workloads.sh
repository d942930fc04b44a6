#!/usr/bin/env bash
# workloads.sh BUILD_DIR NAME [ARGS...]
# Runs the workload NAME (examples/opencl/NAME or examples/cuda/NAME under BUILD_DIR/examples)
# with ARGS natively and through Tandem (`tandem run` against tandemd servers on 127.0.0.1),
# and compares stdout after dropping the lines that start with "time:" (timings, device
# names). Fails on any difference or a non-zero exit either way. Every server started here
# is stopped on exit (trap).
#
#   OpenCL workloads: as tests/e2e/e2e.sh: native OpenCL from scripts/lib/opencl-vendors.sh
#     (PoCL on CI), both ICD loaders pinned to it, tandemd --backend opencl.
#   CUDA workloads (remd): exit 77 (skip) unless nvidia-smi lists a GPU; the native run uses
#     the real libcudart, then tandemd --backend cuda and `tandem run` (LD_PRELOAD of
#     libtandem-cudart.so).
#
# Environment:
#   WORKLOADS_SERVERS  number of tandemd servers (1..4, default 1); the program gets them all
#                      in TANDEM_SERVERS (comma-separated), so its one OpenCL context spans
#                      the servers' devices (multi-server contexts are new in Tandem).
#   WORKLOADS_TIMEOUT  seconds allowed to each run of the program (default 240).
#   TANDEMD, TANDEM    override BUILD_DIR/server/tandemd and BUILD_DIR/tools/tandem.
set -u -o pipefail
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/../../scripts/lib/tandemd.sh"
source "$here/../../scripts/lib/opencl-vendors.sh"

fail() { echo "workloads: FAIL: $*" >&2; exit 1; }
note() { echo "workloads: $*" >&2; }

build=${1:-}; name=${2:-}
[[ -n $build && -n $name ]] || fail "usage: workloads.sh BUILD_DIR NAME [ARGS...]"
shift 2
tandemd=${TANDEMD:-$build/server/tandemd}
tandem=${TANDEM:-$build/tools/tandem}
SERVERS=${WORKLOADS_SERVERS:-1}
RUN_TIMEOUT=${WORKLOADS_TIMEOUT:-240}
[[ $SERVERS =~ ^[1-4]$ ]] || fail "WORKLOADS_SERVERS must be 1..4 (got '$SERVERS')"

if [[ -x $build/examples/opencl/$name ]]; then
  api=opencl prog=$build/examples/opencl/$name backend=opencl
elif [[ -x $build/examples/cuda/$name || -f $here/../../examples/cuda/$name.cu ]]; then
  api=cuda prog=$build/examples/cuda/$name backend=cuda
  if [[ ! -e /dev/nvidia0 ]] || ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
    echo "SKIP: no NVIDIA GPU here (nvidia-smi lists none): $name needs one"
    exit 77
  fi
  [[ -x $prog ]] || fail "$name not built (nvcc missing?): $prog"
else
  fail "no workload $name under $build/examples"
fi
# A missing piece is a failure, never a skip.
[[ -x $tandemd ]] || fail "tandemd not built: $tandemd"
[[ -x $tandem ]] || fail "the tandem command is not built: $tandem"

work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-workloads.XXXXXX") || fail "mktemp"
server_pids=()
cleanup() {
  local rc=$? i
  for i in "${!server_pids[@]}"; do
    stop_tandemd "${server_pids[$i]}"
    if [[ $rc -ne 0 && -s $work/tandemd.$i.log ]]; then
      echo "---- tandemd $i log (last 30 lines) ----" >&2
      tail -n 30 "$work/tandemd.$i.log" >&2
    fi
  done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

unset OCL_ICD_FILENAMES TANDEM_SERVERS LD_PRELOAD
export TANDEM_CONNECT_TIMEOUT_MS=${TANDEM_CONNECT_TIMEOUT_MS:-5000}
if [[ $api == opencl ]]; then
  NATIVE=$(native_opencl_vendors "$work") || fail "no native OpenCL"
  NATIVE_LIBS=$(icd_libs "$NATIVE")
  export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
  mkdir -p "$POCL_CACHE_DIR"
  native() { OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS timeout -k 5 "$RUN_TIMEOUT" "$@"; }
  server_env=(env "OCL_ICD_VENDORS=$NATIVE" "OCL_ICD_FILENAMES=$NATIVE_LIBS")
else
  # The native run needs the real runtime: the toolkit's folder if the loader does not know it.
  native_path=${LD_LIBRARY_PATH:-}
  if ! ldconfig -p | grep 'libcudart\.so\.13 ' >/dev/null; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
      [[ -e $d/libcudart.so.13 ]] && native_path=$d${native_path:+:$native_path} && break
    done
  fi
  native() { LD_LIBRARY_PATH=$native_path timeout -k 5 "$RUN_TIMEOUT" "$@"; }
  server_env=(env)
fi
through_tandem() { timeout -k 5 "$RUN_TIMEOUT" "$tandem" run --servers "$SERVER_LIST" -- "$@"; }

# start_server I: tandemd number I on a free port, in its own process group; appends to
# SERVER_LIST once `tandem info` answers.
start_server() {
  local i=$1 tries port addr pid
  for tries in 1 2 3; do
    port=$(free_port)
    addr=127.0.0.1:$port
    setsid "${server_env[@]}" "$tandemd" --listen "$addr" --backend "$backend" >"$work/tandemd.$i.log" 2>&1 &
    pid=$!
    server_pids[$i]=$pid
    if ! tandemd_listens "$pid" "$work/tandemd.$i.log"; then
      note "tandemd $i on $addr did not listen (try $tries):"; cat "$work/tandemd.$i.log" >&2
      stop_tandemd "$pid"; server_pids[$i]=""; continue
    fi
    local deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
      if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"; note "tandemd $i exited with $? (try $tries):"; cat "$work/tandemd.$i.log" >&2
        server_pids[$i]=""; break
      fi
      if TANDEM_CONNECT_TIMEOUT_MS=2000 "$tandem" info --servers "$addr" >"$work/info.out" 2>"$work/info.err"; then
        SERVER_LIST=${SERVER_LIST:+$SERVER_LIST,}$addr
        note "tandemd $i ready on $addr (backend $backend)"
        return 0
      fi
      sleep 0.3
    done
    if [[ -n ${server_pids[$i]} ]]; then
      note "tandemd $i on $addr did not answer tandem info in 30 s:"; cat "$work/info.err" >&2
      return 1
    fi
  done
  return 1
}

note "$name $* natively ($api)"
native "$prog" "$@" >"$work/native.out" 2>"$work/native.err"; rc_n=$?
if ((rc_n != 0)); then
  cat "$work/native.out" "$work/native.err" >&2
  ((rc_n == 124 || rc_n == 137)) && fail "$name timed out natively after $RUN_TIMEOUT s"
  fail "$name fails natively (exit $rc_n): the workload or the native $api is broken, not Tandem"
fi

SERVER_LIST=""
for ((i = 0; i < SERVERS; ++i)); do start_server "$i" || fail "tandemd $i would not start"; done
note "$name $* through Tandem ($SERVERS server(s): $SERVER_LIST)"
through_tandem "$prog" "$@" >"$work/tandem.out" 2>"$work/tandem.err"; rc_t=$?

grep -v '^time:' "$work/native.out" >"$work/native.cmp"
grep -v '^time:' "$work/tandem.out" >"$work/tandem.cmp"
ok=1
if ! cmp -s "$work/native.cmp" "$work/tandem.cmp"; then
  ok=0; echo "---- stdout differs (native vs Tandem, time: lines dropped) ----" >&2
  diff -u --label native --label tandem "$work/native.cmp" "$work/tandem.cmp" >&2
fi
if ((rc_t != 0)); then
  ok=0; echo "---- exit code through Tandem: $rc_t$( ((rc_t == 124 || rc_t == 137)) && echo " (timed out after $RUN_TIMEOUT s)") ----" >&2
fi
if ((ok == 0)); then
  echo "---- Tandem stderr (last 40 lines) ----" >&2; tail -n 40 "$work/tandem.err" >&2
  fail "$name: Tandem differs from native"
fi
echo "---- native ----"; cat "$work/native.out"
echo "---- through Tandem ----"; cat "$work/tandem.out"
echo "workloads: $name: identical natively and through Tandem ($(wc -l <"$work/tandem.cmp") lines compared, $SERVERS server(s))"
