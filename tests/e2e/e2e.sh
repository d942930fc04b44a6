#!/usr/bin/env bash
# End-to-end tests against a real tandemd on 127.0.0.1 (STYLE.md point 9): each test starts
# its own server on a free port, runs an unmodified program natively and through Tandem, and
# compares what they print. Every process started here is stopped on exit (trap).
#
#   e2e.sh example TANDEMD TANDEM PROGRAM [IGNORE_REGEX]
#       PROGRAM natively, then via `tandem run`: stdout (minus lines matching IGNORE_REGEX,
#       default '^#') must be byte-identical and both exit codes 0.
#   e2e.sh clinfo TANDEMD TANDEM
#       Debian's clinfo through Tandem exits 0, lists the platform "Tandem" and each device
#       with the native name and key properties (see KEYS below for which, and why).
#   e2e.sh info TANDEMD TANDEM
#       `tandem info` lists the server, its backend and the native device name.
#   e2e.sh port_taken TANDEMD TANDEM
#       A second tandemd on the first one's address exits with "Address already in use", and
#       tandemd_listens (what every test's start-up waits for) says so, while `tandem info` on
#       that address still answers (from the first server): why start-up cannot trust it alone.
#
# Native OpenCL: $TANDEM_NATIVE_OPENCL (an .icd, a folder or a .so) if set; else NVIDIA's
# OpenCL when the driver's libnvidia-opencl.so.1 is present; else PoCL. tandemd uses the same.
# Both loaders are pinned: OCL_ICD_VENDORS for ocl-icd, OCL_ICD_FILENAMES for Khronos'.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/tandemd.sh"

fail() { echo "e2e: FAIL: $*" >&2; exit 1; }
note() { echo "e2e: $*" >&2; }

mode=${1:-}; tandemd=${2:-}; tandem=${3:-}
[[ -n $mode ]] || fail "usage: e2e.sh example|clinfo|info|port_taken TANDEMD TANDEM [PROGRAM [IGNORE_REGEX]]"
# A missing piece is a failure, never a skip: these tests are what proves the pieces work.
[[ -n $tandemd && -x $tandemd ]] || fail "tandemd not built (got '${tandemd}')"
[[ -n $tandem && -x $tandem ]] || fail "the tandem command is not built (got '${tandem}')"

work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-e2e.XXXXXX") || fail "mktemp"
server_pid=""
second_pid=""  # port_taken's second server
cleanup() {
  local rc=$?
  stop_tandemd "$second_pid"
  stop_tandemd "$server_pid"  # its own process group (setsid): the broker and its workers
  if [[ $rc -ne 0 && -s $work/tandemd.log ]]; then
    echo "---- tandemd log (last 40 lines) ----" >&2
    tail -n 40 "$work/tandemd.log" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- which OpenCL is native (both ICD loaders pinned to it) --------------------------------
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/opencl-vendors.sh"
NATIVE=$(native_opencl_vendors "$work") || fail "no native OpenCL"
NATIVE_LIBS=$(icd_libs "$NATIVE")
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"
unset OCL_ICD_FILENAMES TANDEM_SERVERS LD_PRELOAD
export TANDEM_CONNECT_TIMEOUT_MS=${TANDEM_CONNECT_TIMEOUT_MS:-5000}
RUN_TIMEOUT=${TANDEM_E2E_RUN_TIMEOUT:-120}

native() { OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS timeout -k 5 "$RUN_TIMEOUT" "$@"; }
through_tandem() { timeout -k 5 "$RUN_TIMEOUT" "$tandem" run --servers "$SERVER" -- "$@"; }

# ---- the server ------------------------------------------------------------------------------
start_server() {
  local tries port
  for tries in 1 2 3; do
    port=$(free_port)
    SERVER=127.0.0.1:$port
    # Its own process group, so cleanup() can stop the broker and every worker it forked.
    OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS setsid "$tandemd" --listen "$SERVER" --backend opencl >"$work/tandemd.log" 2>&1 &
    server_pid=$!
    if ! tandemd_listens "$server_pid" "$work/tandemd.log"; then
      note "tandemd on $SERVER did not listen (try $tries):"; cat "$work/tandemd.log" >&2
      stop_tandemd "$server_pid"; server_pid=""; continue
    fi
    local deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
      if ! kill -0 "$server_pid" 2>/dev/null; then
        wait "$server_pid"; note "tandemd exited with $? (try $tries):"; cat "$work/tandemd.log" >&2
        server_pid=""; break
      fi
      if TANDEM_CONNECT_TIMEOUT_MS=2000 "$tandem" info --servers "$SERVER" >"$work/info.out" 2>"$work/info.err"; then
        note "tandemd ready on $SERVER (native OpenCL: $NATIVE)"
        return 0
      fi
      sleep 0.3
    done
    if [[ -n $server_pid ]]; then
      note "tandemd on $SERVER did not answer tandem info in 30 s:"; cat "$work/info.err" >&2
      return 1
    fi
  done
  fail "tandemd would not start"
}

check_icd_found() {
  "$tandem" run --servers 127.0.0.1:1 --dry-run -- true >"$work/dry.out" 2>&1 || { cat "$work/dry.out" >&2; fail "tandem run cannot find Tandem's libraries"; }
  grep -q '^OCL_ICD_VENDORS=' "$work/dry.out" || fail "libtandem-opencl.so not built (tandem run found no OpenCL ICD)"
}

# ---- modes ------------------------------------------------------------------------------------
run_example() {
  local prog=$1 ignore=${2:-'^#'} name rc_n rc_t
  [[ -x $prog ]] || fail "example not built: $prog"
  name=$(basename "$prog")
  native "$prog" >"$work/native.out" 2>"$work/native.err"; rc_n=$?
  if ((rc_n != 0)); then
    cat "$work/native.out" "$work/native.err" >&2
    fail "$name fails natively (exit $rc_n): the example or the native OpenCL is broken, not Tandem"
  fi
  start_server || fail "no server"
  through_tandem "$prog" >"$work/tandem.out" 2>"$work/tandem.err"; rc_t=$?
  grep -Ev "$ignore" "$work/native.out" >"$work/native.cmp"
  grep -Ev "$ignore" "$work/tandem.out" >"$work/tandem.cmp"
  local ok=1
  if ! cmp -s "$work/native.cmp" "$work/tandem.cmp"; then
    ok=0; echo "---- stdout differs (native vs Tandem) ----" >&2
    diff -u --label native --label tandem "$work/native.cmp" "$work/tandem.cmp" >&2
  fi
  if ((rc_t != rc_n)); then ok=0; echo "---- exit code: native $rc_n, Tandem $rc_t ----" >&2; fi
  if ((ok == 0)); then
    echo "---- Tandem stderr ----" >&2; tail -n 40 "$work/tandem.err" >&2
    fail "$name: Tandem differs from native"
  fi
  cat "$work/tandem.out"
  echo "e2e: $name: identical natively and through Tandem ($(wc -l <"$work/tandem.cmp") lines compared)"
}

# Device properties compared between `clinfo --raw` natively and through Tandem. They are the
# ones a program sizes its work by, and Tandem forwards them from the real device. Left out on
# purpose: platform lines (Tandem is its own platform: name, vendor, version, suffix, extensions
# are Tandem's); versions (CL_DEVICE_VERSION, CL_DRIVER_VERSION, OPENCL_C_VERSION, numeric and
# 3.0 "with version" lists: Tandem implements OpenCL 1.2 whatever the device does); extensions
# (Tandem lists only those it forwards); images and samplers (not exposed by Tandem yet); queue
# properties, execution capabilities, partitions, built-in kernels, SVM, pipes, host-unified
# memory (properties of Tandem's host-side implementation, not of the device);
# CL_DEVICE_LINKER_AVAILABLE (Tandem reports CL_FALSE while it has no clCompileProgram /
# clLinkProgram: a property of Tandem, not of the device).
KEYS=(
  CL_DEVICE_NAME CL_DEVICE_VENDOR CL_DEVICE_VENDOR_ID CL_DEVICE_TYPE CL_DEVICE_PROFILE
  CL_DEVICE_AVAILABLE CL_DEVICE_COMPILER_AVAILABLE
  CL_DEVICE_MAX_COMPUTE_UNITS CL_DEVICE_MAX_CLOCK_FREQUENCY CL_DEVICE_ADDRESS_BITS
  CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS CL_DEVICE_MAX_WORK_ITEM_SIZES CL_DEVICE_MAX_WORK_GROUP_SIZE
  CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT
  CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG
  CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE
  CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR CL_DEVICE_NATIVE_VECTOR_WIDTH_SHORT
  CL_DEVICE_NATIVE_VECTOR_WIDTH_INT CL_DEVICE_NATIVE_VECTOR_WIDTH_LONG
  CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT CL_DEVICE_NATIVE_VECTOR_WIDTH_DOUBLE
  CL_DEVICE_SINGLE_FP_CONFIG CL_DEVICE_DOUBLE_FP_CONFIG CL_DEVICE_ENDIAN_LITTLE
  CL_DEVICE_GLOBAL_MEM_SIZE CL_DEVICE_MAX_MEM_ALLOC_SIZE CL_DEVICE_MEM_BASE_ADDR_ALIGN
  CL_DEVICE_MIN_DATA_TYPE_ALIGN_SIZE CL_DEVICE_ERROR_CORRECTION_SUPPORT
  CL_DEVICE_GLOBAL_MEM_CACHE_TYPE CL_DEVICE_GLOBAL_MEM_CACHE_SIZE CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE
  CL_DEVICE_LOCAL_MEM_TYPE CL_DEVICE_LOCAL_MEM_SIZE CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE
  CL_DEVICE_MAX_CONSTANT_ARGS CL_DEVICE_MAX_PARAMETER_SIZE CL_DEVICE_PROFILING_TIMER_RESOLUTION
)

# "[SUFFIX/N]   KEY   value" -> "device N KEY value" for the KEYS, whitespace collapsed.
clinfo_props() {
  local pattern
  pattern=$(IFS='|'; echo "${KEYS[*]}")
  sed -nE "s/^\[[^]/]*\/([0-9]+)\][[:space:]]+($pattern)[[:space:]]+(.*)$/device \1 \2 \3/p" "$1" |
    sed -E 's/[[:space:]]+/ /g; s/ $//' | sort
}

run_clinfo() {
  command -v clinfo >/dev/null || fail "clinfo not installed"
  native clinfo --raw >"$work/native.raw" 2>"$work/native.err" || fail "clinfo --raw fails natively"
  native clinfo -l >"$work/native.l" 2>&1 || fail "clinfo -l fails natively"
  start_server || fail "no server"
  local rc
  through_tandem clinfo >"$work/tandem.txt" 2>"$work/tandem.err"; rc=$?
  ((rc == 0)) || { tail -n 30 "$work/tandem.err" >&2; fail "clinfo through Tandem exits $rc"; }
  through_tandem clinfo -l >"$work/tandem.l" 2>>"$work/tandem.err" || fail "clinfo -l through Tandem exits non-zero"
  through_tandem clinfo --raw >"$work/tandem.raw" 2>>"$work/tandem.err" || fail "clinfo --raw through Tandem exits non-zero"
  echo "---- clinfo -l through Tandem ----"; cat "$work/tandem.l"

  grep -q '^Platform #0: Tandem$' "$work/tandem.l" || fail "clinfo -l does not list the platform \"Tandem\" first"
  local np
  np=$(grep -c '^Platform #' "$work/tandem.l")
  ((np == 1)) || fail "clinfo through Tandem sees $np platforms: only Tandem's ICD should be visible"
  # Device names: the native ones, in order (one server, so the same list).
  diff -u --label native --label tandem <(grep -E '^ *[`|]-- Device' "$work/native.l" | sed 's/^.*Device #/Device #/') \
    <(grep -E '^ *[`|]-- Device' "$work/tandem.l" | sed 's/^.*Device #/Device #/') >&2 ||
    fail "clinfo -l device list differs"

  clinfo_props "$work/native.raw" >"$work/native.props"
  clinfo_props "$work/tandem.raw" >"$work/tandem.props"
  local n
  n=$(wc -l <"$work/native.props")
  ((n >= 20)) || fail "only $n of the compared properties found natively: clinfo's format changed?"
  if ! diff -u --label native --label tandem "$work/native.props" "$work/tandem.props" >&2; then
    fail "device properties differ between native and Tandem (see diff)"
  fi
  echo "e2e: clinfo: platform Tandem listed, $n device property lines identical to native"
}

run_info() {
  native clinfo -l >"$work/native.l" 2>&1 || fail "clinfo -l fails natively"
  start_server || fail "no server"
  local rc
  "$tandem" info --servers "$SERVER" >"$work/info.out" 2>"$work/info.err"; rc=$?
  ((rc == 0)) || { cat "$work/info.err" >&2; fail "tandem info exits $rc"; }
  cat "$work/info.out"
  local name
  name=$(grep -m1 -E '^ *[`|]-- Device #0: ' "$work/native.l" | sed 's/^.*Device #0: //')
  # "server HOST:PORT (backend opencl[, platform]): device 0: NAME [OpenCL]"
  grep -F "server $SERVER (backend opencl" "$work/info.out" | grep -qF "): device 0: $name [OpenCL]" ||
    fail "tandem info does not list 'server $SERVER (backend opencl...): device 0: $name [OpenCL]'"
  echo "e2e: tandem info lists the server and its device"
}

run_port_taken() {
  start_server || fail "no server"
  local rc
  OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS setsid "$tandemd" --listen "$SERVER" --backend opencl \
    >"$work/second.log" 2>&1 &
  second_pid=$!
  if tandemd_listens "$second_pid" "$work/second.log"; then
    cat "$work/second.log" >&2
    fail "tandemd_listens says a second tandemd listens on $SERVER, which the first one holds"
  fi
  kill -0 "$second_pid" 2>/dev/null && fail "the second tandemd neither listened nor exited in 30 s"
  wait "$second_pid"; rc=$?
  second_pid=""
  ((rc != 0)) || fail "the second tandemd exited 0 although it could not listen"
  grep -q "Address already in use" "$work/second.log" || { cat "$work/second.log" >&2; fail "the second tandemd did not say why it stopped"; }
  TANDEM_CONNECT_TIMEOUT_MS=2000 "$tandem" info --servers "$SERVER" >"$work/info.out" 2>"$work/info.err" ||
    fail "tandem info no longer reaches the first server on $SERVER"
  # A log reused from an earlier server: its line names that server's pid, not this one's.
  cp "$work/tandemd.log" "$work/stale.log"
  grep -q "tandemd listening on" "$work/stale.log" || fail "the first server's log has no start-up line"
  sleep 2 &
  if tandemd_listens $! "$work/stale.log"; then fail "tandemd_listens took an earlier server's line for this process's"; fi
  echo "e2e: a second tandemd on $SERVER exited ($rc, Address already in use) and tandemd_listens said so; tandem info still answers from the first; an earlier server's line is not taken for a new one's"
}

case $mode in
  example) [[ -n ${4:-} ]] || fail "example: no program"; check_icd_found; run_example "$4" "${5:-^#}" ;;
  clinfo) check_icd_found; run_clinfo ;;
  info) run_info ;;
  port_taken) run_port_taken ;;
  *) fail "unknown mode $mode" ;;
esac
