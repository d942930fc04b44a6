#!/usr/bin/env bash
# One idempotent setup for a fresh Debian 12 or Ubuntu 24.04 machine, run as root:
# installs the packages Tandem needs (only those missing), then configures and builds.
#
#   bash scripts/setup.sh            # build dir ./build, or $TANDEM_BUILD_DIR
#
# Without a reachable package registry (the GPU machine has no network) installation is
# skipped and the build goes on with what is there. Headers carried in ./.deps/include by
# scripts/device-deps.sh stand in for libfabric-dev and libxxhash-dev.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD_DIR:-$ROOT/build}
JOBS=${TANDEM_JOBS:-$(nproc)}
log() { echo "setup: $*" >&2; }

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libfabric-dev libfabric-bin rdma-core libibverbs-dev librdmacm-dev ibverbs-providers
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libcli11-dev libfmt-dev python3
)

# Headers carried from another machine replace their -dev package (the runtime is there).
deps=$ROOT/.deps/include
carried() {
  case $1 in
    libfabric-dev | libfabric-bin) [[ -e $deps/rdma/fabric.h ]] ;;
    libxxhash-dev) [[ -e $deps/xxhash.h ]] ;;
    opencl-headers) [[ -e $deps/CL/cl_icd.h ]] ;;
    *) return 1 ;;
  esac
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# What a package provides, for machines where it came from elsewhere (a pip cmake, headers
# from another package): then it is not missing.
provided() {
  case $1 in
    cmake) command -v cmake >/dev/null ;;
    ninja-build) command -v ninja >/dev/null ;;
    opencl-headers) [[ -e /usr/include/CL/cl.h && -e /usr/include/CL/cl_icd.h ]] ;;
    *) return 1 ;;
  esac
}

missing=()
for p in "${PACKAGES[@]}"; do
  if carried "$p"; then continue; fi
  installed "$p" || provided "$p" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  log "all packages present"
elif [[ $(id -u) -ne 0 ]]; then
  log "missing packages: ${missing[*]} (run as root to install them); trying to build anyway"
else
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A registry that cannot be reached is not fatal: the build below says what is missing.
  if timeout 180 apt-get update -qq -o Acquire::Retries=0 -o Acquire::http::Timeout=20; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
      log "apt-get install failed; going on with what is installed"
  else
    log "no package registry reachable: skipping installation"
  fi
fi

for tool in cmake ninja c++; do
  command -v "$tool" >/dev/null || { log "$tool is missing and could not be installed"; exit 1; }
done

# nvcc is usually outside PATH; the CUDA parts are built when it is found.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

log "configuring $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTANDEM_WERROR=ON ${TANDEM_CMAKE_ARGS:-}
log "building with $JOBS jobs"
ninja -C "$BUILD" -j "$JOBS"
log "done: $BUILD"
