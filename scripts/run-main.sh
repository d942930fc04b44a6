#!/usr/bin/env bash
# The main job: set up and build, start tandemd on 127.0.0.1, run a real OpenCL program
# (examples/opencl/hello_tandem: a tiled matrix multiply and a reduction) through Tandem,
# and print its result and where it ran. With an NVIDIA GPU the server uses NVIDIA's
# OpenCL; otherwise PoCL on the CPU. The server is always stopped at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib/tandemd.sh"
BUILD=${TANDEM_BUILD_DIR:-$ROOT/build}
log() { echo "run-main: $*" >&2; }

# TANDEM_SKIP_SETUP=1: the build is already there (e.g. built by hand); go straight on.
[[ ${TANDEM_SKIP_SETUP:-0} == 1 ]] || bash "$ROOT/scripts/setup.sh"

TANDEMD=$BUILD/server/tandemd
TANDEM=$BUILD/tools/tandem
PROGRAM=$BUILD/examples/opencl/hello_tandem
for f in "$TANDEMD" "$TANDEM" "$PROGRAM"; do [[ -x $f ]] || { log "not built: $f"; exit 1; }; done

work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-main.XXXXXX")
server_pid=""
cleanup() {
  stop_tandemd "$server_pid"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"

# Which OpenCL tandemd serves: NVIDIA's on a GPU machine, else PoCL; both loaders pinned.
source "$ROOT/scripts/lib/opencl-vendors.sh"
vendors=$(native_opencl_vendors "$work")
libs=$(icd_libs "$vendors")
log "tandemd will use OpenCL from $vendors ($libs)"

# Token-less is allowed on loopback only; its own process group so cleanup stops its workers.
# Up to three ports: another program may take free_port's port before tandemd binds it.
ready=0
for _ in 1 2 3; do
  port=$(free_port)
  server=127.0.0.1:$port
  OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs setsid "$TANDEMD" --listen "$server" --backend opencl >"$work/tandemd.log" 2>&1 &
  server_pid=$!
  if tandemd_listens "$server_pid" "$work/tandemd.log"; then
    for _ in $(seq 1 100); do
      kill -0 "$server_pid" 2>/dev/null || break
      if TANDEM_CONNECT_TIMEOUT_MS=2000 "$TANDEM" info --servers "$server" >"$work/info.txt" 2>/dev/null; then ready=1; break; fi
      sleep 0.3
    done
  fi
  ((ready == 1)) && break
  log "tandemd did not come up on $server; its log:"
  cat "$work/tandemd.log" >&2
  stop_tandemd "$server_pid"
done
((ready == 1)) || exit 1

echo "== Tandem server and its devices (tandem info) =="
cat "$work/info.txt"
echo "== hello_tandem through Tandem (tandem run --servers $server -- hello_tandem) =="
rc=0
"$TANDEM" run --servers "$server" -- "$PROGRAM" || rc=$?
echo "== where it ran: the program saw the platform above; its kernels ran on $(head -n1 "$work/info.txt" | sed 's/^server //') =="
exit "$rc"
