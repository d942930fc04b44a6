#!/usr/bin/env bash
# A module global lands at the same device address whether or not a keepalive ran before the
# program first used its module (GPU only). Fault tolerance addresses a global by the
# primary's address on every replica, and each replica's link sends its own keepalive when it
# has been quiet for TANDEM_KEEPALIVE_MS; tandemd used to load the keepalive's own module (with
# a global) on the first Warm, so a replica warmed before the program's module load placed the
# program's globals elsewhere ("a module global lies at different addresses on the replicas",
# seen once in ft.cuda.bitflip3 under load).
#   - two CUDA tandemd, TANDEM_REDUNDANCY=2 (their workers run with a fixed layout);
#   - warm_layout without keepalive (TANDEM_KEEPALIVE_MS=0), then with a 1 ms keepalive and a
#     40 ms pause before the module's first use (TANDEM_STATS=1 must count warm-ups);
#   - both runs succeed and print the same global address.
#
#   warm_layout.sh BUILD_DIR
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BUILD=${1:-}
fail() { echo "warm_layout: FAIL: $*" >&2; exit 1; }
note() { echo "warm_layout: $*" >&2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "warm_layout: no GPU: skipped" >&2; exit 77; }
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem PROG=$BUILD/tests/ft/ft_warm_layout
for f in "$TANDEMD" "$TANDEM" "$PROG"; do [[ -x $f ]] || fail "not built: $f"; done

API=cuda
source "$HERE/lib.sh"
start a; start b
export TANDEM_SERVERS=${ADDR[a]},${ADDR[b]} TANDEM_REDUNDANCY=2

run() {  # run NAME GAP_MS [VAR=VALUE...]
  local name=$1 gap=$2; shift 2
  env TANDEM_STATS=1 "$@" timeout -k 5 120 "$TANDEM" run -- "$PROG" "$gap" >"$work/$name.out" 2>"$work/$name.err" ||
    fail "the $name run failed: $(head -3 "$work/$name.out")"
  grep -o "global at 0x[0-9a-f]*" "$work/$name.out" || fail "the $name run printed no address"
}
cold=$(run cold 0 TANDEM_KEEPALIVE_MS=0)
warmed=$(run warmed 40 TANDEM_KEEPALIVE_MS=1)
warmups=$(grep -o "keepalive warm-ups: [0-9]*" "$work/warmed.err" | grep -o "[0-9]*$")
((${warmups:-0} > 0)) || fail "no keepalive ran in the pause: the scenario did not happen"
note "without keepalive: $cold; after $warmups warm-ups: $warmed"
[[ $cold == "$warmed" ]] || fail "the global moved with the keepalive: $cold, then $warmed"
no_leaks a b
note "PASS"
