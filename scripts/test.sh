#!/usr/bin/env bash
# Sets up (scripts/setup.sh: packages, configure, build), then runs the whole test suite.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD_DIR:-$ROOT/build}
# PoCL compiles kernels into a cache; keep it out of $HOME and share it across tests.
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$BUILD/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"

# TANDEM_SKIP_SETUP=1: the build is already there (e.g. built by hand); go straight on.
[[ ${TANDEM_SKIP_SETUP:-0} == 1 ]] || bash "$ROOT/scripts/setup.sh"
ctest --test-dir "$BUILD" --output-on-failure -j2 --timeout 300
