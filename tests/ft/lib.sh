# Sourced by ft.sh and linkcut.sh: a work folder; tandemd servers in their own process
# groups, stopped (and resumed first, if a test froze one) at exit, with the last lines of
# every log shown when the test failed; the machine's native OpenCL for servers and native
# runs. Needs from the caller: fail, TANDEMD, TANDEM; optional: API (opencl | cuda, default
# opencl), SERVER_ENV (extra VAR=VALUE words for tandemd's environment).
LIB_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$LIB_HERE/../../scripts/lib/tandemd.sh"
source "$LIB_HERE/../../scripts/lib/opencl-vendors.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-ft.XXXXXX") || fail mktemp
declare -A PID ADDR
ft_cleanup() {
  local rc=$? name f
  for name in "${!PID[@]}"; do
    kill -CONT -- "-${PID[$name]}" 2>/dev/null
    stop_tandemd "${PID[$name]}"
  done
  if ((rc != 0)); then
    for f in "$work"/*.err "$work"/*.log; do [[ -s $f ]] && { echo "---- $f (last 30 lines)"; tail -30 "$f"; } >&2; done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap ft_cleanup EXIT
trap 'exit 130' INT TERM

NATIVE=$(native_opencl_vendors "$work") || fail "no native OpenCL"
NATIVE_LIBS=$(icd_libs "$NATIVE")
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"
unset OCL_ICD_FILENAMES TANDEM_SERVERS LD_PRELOAD TANDEM_REDUNDANCY TANDEM_SPARE_SERVERS TANDEM_CHECKPOINT_PERIOD
export TANDEM_CONNECT_TIMEOUT_MS=5000

# start NAME [tandemd options...]: a server in its own process group; sets ADDR and PID.
start() {
  local name=$1 port tries; shift
  for tries in 1 2 3; do
    port=$(free_port)
    ADDR[$name]=127.0.0.1:$port
    # shellcheck disable=SC2086  # SERVER_ENV is a list of words on purpose
    OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS env ${SERVER_ENV:-} setsid "$TANDEMD" \
      --listen "${ADDR[$name]}" --backend "${API:-opencl}" "$@" >"$work/$name.log" 2>&1 &
    PID[$name]=$!
    if tandemd_listens "${PID[$name]}" "$work/$name.log"; then
      # A server whose sessions die on purpose cannot answer `tandem info` (a session of
      # its own): its broker's start-up line is all there is to wait for.
      [[ " $* " == *" --inject-exit-after "* ]] && return 0
      local deadline=$((SECONDS + 30))
      while ((SECONDS < deadline)) && kill -0 "${PID[$name]}" 2>/dev/null; do
        TANDEM_CONNECT_TIMEOUT_MS=2000 "$TANDEM" info --servers "${ADDR[$name]}" >/dev/null 2>&1 && return 0
        sleep 0.2
      done
    fi
    echo "ft: tandemd $name on ${ADDR[$name]} did not start (try $tries):" >&2
    tail -5 "$work/$name.log" >&2
    stop_tandemd "${PID[$name]}"
  done
  fail "tandemd $name did not start"
}
stop() { stop_tandemd "${PID[$1]}"; unset "PID[$1]"; }

# sessions NAME: live session workers of a server (each session is one worker process).
sessions() { pgrep -P "${PID[$1]}" 2>/dev/null | wc -l; }
# no_leaks NAME...: each server's sessions end within 10 s of the program's exit.
no_leaks() {
  local name deadline
  for name in "$@"; do
    deadline=$((SECONDS + 10))
    while (($(sessions "$name") > 0)); do
      ((SECONDS < deadline)) || fail "$name still holds $(sessions "$name") session(s) of the finished program"
      sleep 0.2
    done
  done
}
