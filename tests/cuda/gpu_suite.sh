#!/usr/bin/env bash
# gpu_suite.sh TANDEMD LIB PROGRAM...
# Runs each CUDA test program natively and through Tandem (LD_PRELOAD=LIB, a tandemd with the
# CUDA backend on 127.0.0.1) and compares stdout and exit code; then runs one program again
# through Tandem with the real CUDA libraries hidden from it (no libcudart, no libcuda, empty
# LD_LIBRARY_PATH), as on a client with no CUDA installed. Exit 77 (skip) without a GPU.
# Programs named multi_* run through two tandemd (device 0 of each), natively on the GPUs there are;
# symbols and callbacks run once more with TANDEM_REDUNDANCY=2 on the two servers, and callbacks
# with TANDEM_TEST_CALLBACK_GAP_US, alone and under redundancy.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/tandemd.sh"
tandemd=$1 lib=$2; shift 2
programs=("$@")

if [[ ! -e /dev/nvidia0 ]] || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no NVIDIA GPU here (/dev/nvidia0 missing or nvidia-smi fails): the CUDA suite needs one"
  exit 77
fi
[[ -x $tandemd ]] || { echo "FAIL: tandemd not built: $tandemd"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-cuda.XXXXXX") || exit 1
keep=${TANDEM_CUDA_SUITE_LOGS:-}  # a folder to copy every output to
server_pid="" server_pids=()
cleanup() {
  local rc=$?
  local pid
  for pid in "${server_pids[@]}"; do stop_tandemd "$pid"; done
  [[ -n $keep ]] && mkdir -p "$keep" && cp -r "$work"/. "$keep"/
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

unset TANDEM_SERVERS LD_PRELOAD
RUN_TIMEOUT=${TANDEM_CUDA_RUN_TIMEOUT:-120}
# The native runs need the real runtime; the toolkit's folder if the loader does not know it.
native_path=${LD_LIBRARY_PATH:-}
if ! ldconfig -p | grep -q 'libcudart\.so\.13 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/libcudart.so.13 ]] && native_path=$d${native_path:+:$native_path} && break
  done
fi

# tandemd in its own process group, so cleanup stops the broker and its session workers.
# start_server LOG: sets SERVER.
start_server() {
  local port log=$work/$1
  for _ in 1 2 3; do
    port=$(free_port)
    SERVER=127.0.0.1:$port
    setsid "$tandemd" --listen "$SERVER" --backend cuda >"$log" 2>&1 &
    server_pid=$!
    server_pids+=("$server_pid")
    tandemd_listens "$server_pid" "$log" && { echo "tandemd ready on $SERVER"; return 0; }
    echo "tandemd did not start on $SERVER:"; cat "$log"
    kill -KILL -- "-$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
  done
  return 1
}
# A second server for the multi_* programs: their two devices are then on two servers (both
# on this GPU), so cross-device waits and copies go server to server.
start_server tandemd2.log || { echo "FAIL: tandemd --backend cuda would not start"; exit 1; }
SERVER2=$SERVER
start_server tandemd.log || { echo "FAIL: tandemd --backend cuda would not start"; exit 1; }

passed=0 failed=0
# compare NAME: native.out/rc against tandem.out/rc in $work/NAME.*
compare() {
  local name=$1 why=""
  cmp -s "$work/$name.native.out" "$work/$name.tandem.out" || why="stdout differs"
  local rn rt
  rn=$(cat "$work/$name.native.rc") rt=$(cat "$work/$name.tandem.rc")
  [[ $rn == "$rt" ]] || why="${why:+$why, }exit code native $rn, Tandem $rt"
  [[ $rn == 0 ]] || why="${why:+$why, }fails natively (exit $rn)"
  if [[ -z $why ]]; then
    echo "PASS $name ($(wc -l <"$work/$name.native.out") lines identical)"
    passed=$((passed + 1))
  else
    echo "FAIL $name: $why"
    diff -u --label native --label tandem "$work/$name.native.out" "$work/$name.tandem.out" | head -40
    echo "---- Tandem stderr (last 20 lines) ----"; tail -n 20 "$work/$name.tandem.err"
    failed=$((failed + 1))
  fi
}

for prog in "${programs[@]}"; do
  name=$(basename "$prog")
  LD_LIBRARY_PATH=$native_path timeout -k 5 "$RUN_TIMEOUT" "$prog" >"$work/$name.native.out" 2>"$work/$name.native.err"
  echo $? >"$work/$name.native.rc"
  servers=$SERVER
  [[ $name == multi_* ]] && servers=$SERVER/0,$SERVER2/0
  LD_PRELOAD=$lib TANDEM_SERVERS=$servers timeout -k 5 "$RUN_TIMEOUT" "$prog" \
    >"$work/$name.tandem.out" 2>"$work/$name.tandem.err"
  echo $? >"$work/$name.tandem.rc"
  compare "$name"
done

# Under redundancy, with two replicas on the two servers: symbols (the replicas' workers run
# with address randomization off, kFeatureFixedLayout, so the program's __device__/__constant__
# symbols lie at the same device address on both), and callbacks (host callbacks are user
# events the client sets once they ran; a read back while one was unset took the first
# checkpoint, whose synchronize waited for it: the program hung).
# callbacks again with TANDEM_TEST_CALLBACK_GAP_US, alone and under redundancy: a synchronize
# then sleeps between waiting for the callbacks and its post, which a callback another thread
# queues meanwhile would take (the synchronize, posted behind its gate, blocked the server's
# session and the callback's queries with it: the program hung, 2026-11-28).
# variant NAME PROG ENV...: PROG through Tandem with ENV, against its native output.
variant() {
  local name=$1 prog=$2 base
  shift 2
  base=$(basename "$prog")
  cp "$work/$base.native.out" "$work/$name.native.out"
  cp "$work/$base.native.rc" "$work/$name.native.rc"
  env LD_PRELOAD="$lib" "$@" timeout -k 5 "$RUN_TIMEOUT" "$prog" >"$work/$name.tandem.out" 2>"$work/$name.tandem.err"
  echo $? >"$work/$name.tandem.rc"
  compare "$name"
}
for prog in "${programs[@]}"; do
  base=$(basename "$prog")
  [[ $base == symbols || $base == callbacks ]] || continue
  variant "$base-redundancy2" "$prog" TANDEM_SERVERS="$SERVER,$SERVER2" TANDEM_REDUNDANCY=2
  [[ $base == callbacks ]] || continue
  variant "$base-gap" "$prog" TANDEM_SERVERS="$SERVER" TANDEM_TEST_CALLBACK_GAP_US=300
  variant "$base-gap-redundancy2" "$prog" TANDEM_SERVERS="$SERVER,$SERVER2" TANDEM_REDUNDANCY=2 \
    TANDEM_TEST_CALLBACK_GAP_US=300
done

# A client with no CUDA at all: in a private mount namespace, empty folders over the toolkit's
# libraries and /dev/null over every libcuda/libcudart the loader knows, no LD_LIBRARY_PATH.
nocuda=${programs[0]}
name="$(basename "$nocuda")-without-cuda"
if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null; then
  cp "$work/$(basename "$nocuda").native.out" "$work/$name.native.out"
  cp "$work/$(basename "$nocuda").native.rc" "$work/$name.native.rc"
  hide=$(ldconfig -p | awk '/lib(cuda|cudart)\.so/ { print $NF }' | xargs -r readlink -f | sort -u | tr '\n' ' ')
  unshare -m bash -c '
    set -e
    empty=$(mktemp -d)
    for f in '"$hide"'; do mount --bind /dev/null "$f"; done
    for d in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib; do [[ -d $d ]] && mount --bind "$empty" "$d"; done
    echo "hidden from the client: /usr/local/cuda*/lib64 '"$hide"'" >&2
    if LD_LIBRARY_PATH= ldconfig -p | awk "/libcuda(rt)?\\.so/ {print \$NF}" | xargs -r cat 2>/dev/null | head -c 4 | grep -q ELF; then
      echo "a CUDA library is still readable" >&2; exit 99
    fi
    exec env -u LD_LIBRARY_PATH LD_PRELOAD='"$lib"' TANDEM_SERVERS='"$SERVER"' timeout -k 5 '"$RUN_TIMEOUT"' '"$nocuda"'
  ' >"$work/$name.tandem.out" 2>"$work/$name.tandem.err"
  echo $? >"$work/$name.tandem.rc"
  head -n 1 "$work/$name.tandem.err"
  compare "$name"
else
  echo "FAIL $name: needs root and unshare to hide the CUDA libraries"
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
((failed == 0))
