#!/usr/bin/env bash
# A/B of two trees on the synchronous loops (GPU machine, from the repository root): builds
# the base tree (a `git archive` tarball) and the working tree, then runs ab_env.sh with the
# base as A and the working tree as B.
#   run(command="bash bench/experiments/round_trip/ab_trees.sh .scratch/base.tar [ROUNDS] [PROVIDERS]", carry=[".deps", ".scratch"])
set -u
BASE_TAR=${1:?usage: ab_trees.sh BASE_TAR [ROUNDS] [PROVIDERS]} ROUNDS=${2:-3} PROVIDERS=${3:-tcp shm}
source bench/experiments/lib.sh
build_ab "$BASE_TAR" /tmp/abt "tandemd tandem tandem_cudart tandem_opencl tandem_fabric_pingpong" \
  -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
bash bench/experiments/round_trip/ab_env.sh "$B" "build=$N" "$ROUNDS" "$PROVIDERS"
