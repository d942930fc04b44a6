#!/usr/bin/env bash
# Run on the dev machine: copies the headers the GPU machine lacks (it has the libfabric1
# and libxxhash0 runtimes, no network, no -dev packages; its OpenCL headers may be old)
# into ./.deps/include, which is git-ignored and which cmake/Deps.cmake searches. Carry .deps
# to the GPU machine with the tree; scripts/setup.sh then does not try to install
# libfabric-dev, libxxhash-dev or opencl-headers.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=$ROOT/.deps/include
mkdir -p "$DEST"

# Every header of a package, keeping its path under /usr/include.
copy_package_headers() {
  local pkg=$1 n=0 f
  while read -r f; do
    [[ -f $f ]] || continue
    mkdir -p "$DEST/$(dirname "${f#/usr/include/}")"
    cp -p "$f" "$DEST/${f#/usr/include/}"
    n=$((n + 1))
  done < <(dpkg -L "$pkg" 2>/dev/null | grep '^/usr/include/.*\.h$' || true)
  echo "$n"
}

n=$(copy_package_headers libfabric-dev)
if ((n == 0)); then  # not a dpkg system: take the folder as it is
  mkdir -p "$DEST/rdma"
  cp -p /usr/include/rdma/*.h "$DEST/rdma/"
  [[ -d /usr/include/rdma/providers ]] && cp -rp /usr/include/rdma/providers "$DEST/rdma/"
fi
[[ -e $DEST/rdma/fabric.h ]] || { echo "device-deps: libfabric headers not found (install libfabric-dev)" >&2; exit 1; }

n=$(copy_package_headers libxxhash-dev)
((n > 0)) || cp -p /usr/include/xxhash.h "$DEST/"
[[ -e $DEST/xxhash.h ]] || { echo "device-deps: xxhash.h not found (install libxxhash-dev)" >&2; exit 1; }

# Khronos' OpenCL headers: the front end needs the cl_api_* types of a recent cl_icd.h, which
# older images (an H100 machine's, seen 2026-11-24) do not have.
n=$(copy_package_headers opencl-headers)
((n > 0)) || { mkdir -p "$DEST/CL" && cp -p /usr/include/CL/*.h "$DEST/CL/"; }
grep -q cl_api_clGetPlatformIDs "$DEST/CL/cl_icd.h" 2>/dev/null ||
  { echo "device-deps: no cl_icd.h with the cl_api_* types (install opencl-headers)" >&2; exit 1; }

echo "device-deps: headers in $DEST:" >&2
(cd "$DEST" && find . -name '*.h' | sort | sed 's|^\./|  |') >&2
