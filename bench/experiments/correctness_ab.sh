#!/usr/bin/env bash
# A/B of two GPU correctness fixes, on the GPU machine: the working tree ("new") against a
# `git archive` tarball of an earlier commit ("base"), each check REPS times per tree.
#
#   warmlayout  tests/ft/warm_layout.sh (two CUDA tandemd, TANDEM_REDUNDANCY=2, a module global's
#               address with and without a keepalive before the module's first use) against
#               each tree's servers and client; the program is the new tree's ft_warm_layout.
#               Fixed in 0a1ce94 (tandemd loads the keepalive's module when the context is
#               made): take a base before it, e.g. c3eae16.
#   callbacks   examples/cuda callbacks (host callbacks after async copies) through two CUDA
#               tandemd with TANDEM_REDUNDANCY=2, stdout against the native run. Fixed in
#               a13aab2 (a callback waits for the copies before it on its stream): take a base
#               from 165c653 on (before it the run hung on the first checkpoint), e.g. 0953489.
#
#   git archive -o /tmp/base.tar 0953489     # on the dev machine, into the carried tree
#   bash bench/experiments/correctness_ab.sh BASE_TAR OUTDIR REPS CHECK...
# Prints one line per run and a tally per tree and check; logs under OUTDIR.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
source bench/experiments/lib.sh

tar=${1:?base tarball} out=${2:?output folder} reps=${3:?repetitions}
shift 3
checks=("$@")
((${#checks[@]})) || { echo "correctness_ab: name a check: warmlayout, callbacks" >&2; exit 2; }
mkdir -p "$out"
prefix=${TMPDIR:-/tmp}/correctness-ab
# The programs come from the new tree only (the base may lack them).
build_tree . "$prefix-new" "$out" new "tandemd tandem tandem_cudart ft_warm_layout_program tandem_cuda_programs" ||
  exit 1
unpack_tree "$tar" "$prefix-base-src" || exit 1
build_tree "$prefix-base-src" "$prefix-base" "$out" base "tandemd tandem tandem_cudart" || exit 1
N=$prefix-new B=$prefix-base W=$out
pids=() vendors="" libs=""  # CUDA servers only: no OpenCL vendors
trap stop_experiment_servers EXIT

declare -A tally
record() {  # record TREE CHECK OK|FAIL DETAIL
  echo "$2 $1 run $3: $4"
  [[ $3 == OK ]] && tally[$1-$2]=$((${tally[$1-$2]:-0} + 1))
}

check_warmlayout() {  # TREE REP
  local build
  build=$(ab_build "$1")
  [[ $1 == new ]] || { mkdir -p "$build/tests/ft" && cp -f "$N/tests/ft/ft_warm_layout" "$build/tests/ft/"; }
  if bash tests/ft/warm_layout.sh "$build" >"$out/warmlayout-$1-$2.log" 2>&1; then
    record "$1" warmlayout OK "$(grep -o 'without keepalive.*' "$out/warmlayout-$1-$2.log")"
  else
    record "$1" warmlayout FAIL "$(grep -m1 FAIL "$out/warmlayout-$1-$2.log")"
  fi
}

# listening LOG: waits (up to 30 s) for a tandemd to say it listens.
listening() {
  local i
  for ((i = 0; i < 300; i++)); do grep -q 'tandemd listening on' "$1" && return 0; sleep 0.1; done
  return 1
}

callbacks_prog=$N/tests/cuda/programs/callbacks
declare -A addr
check_callbacks() {  # TREE REP
  local build log=$out/callbacks-$1-$2 rc
  build=$(ab_build "$1")
  start_server_as a "$build/server/tandemd" cuda "$log-a.log"
  start_server_as b "$build/server/tandemd" cuda "$log-b.log"
  if listening "$log-a.log" && listening "$log-b.log"; then
    LD_PRELOAD=$build/frontends/cuda/libtandem-cudart.so TANDEM_SERVERS=${addr[a]},${addr[b]} TANDEM_REDUNDANCY=2 \
      timeout -k 5 120 "$callbacks_prog" >"$log.out" 2>"$log.err"
    rc=$?
  else
    rc="(a tandemd did not start)"
  fi
  stop_experiment_servers
  pids=()
  if ((rc == 0)) && cmp -s "$out/callbacks-native.out" "$log.out"; then
    record "$1" callbacks OK "identical to native"
  else
    record "$1" callbacks FAIL "exit $rc, $(diff "$out/callbacks-native.out" "$log.out" | grep -c '^>') lines differ"
  fi
}

for check in "${checks[@]}"; do
  if [[ $check == callbacks ]]; then
    [[ -x $callbacks_prog ]] || { echo "correctness_ab: not built: $callbacks_prog" >&2; exit 1; }
    timeout 120 "$callbacks_prog" >"$out/callbacks-native.out" || { echo "correctness_ab: the native run failed" >&2; exit 1; }
  fi
  for ((rep = 1; rep <= reps; rep++)); do
    for tree in base new; do "check_$check" "$tree" "$rep"; done
  done
done
for check in "${checks[@]}"; do
  for tree in base new; do echo "tally $check $tree: ${tally[$tree-$check]:-0} of $reps passed"; done
done
