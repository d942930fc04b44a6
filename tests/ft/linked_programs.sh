#!/usr/bin/env bash
# Programs made by clCompileProgram and clLinkProgram survive a migration (OpenCL; PoCL in CI).
# examples/opencl/separate_compilation compiles with a header, links two executables (one from
# a library) and releases the library and the object it came from right after the last link,
# then runs both executables, reading back each time (a checkpoint: TANDEM_CHECKPOINT_PERIOD=0).
# Its server dies after N commands (--inject-exit-after) for several N across the run; the
# spare rebuilds every live program from the replayed creates, the released inputs of a live
# link among them. Each run's stdout must be identical to the native run, and at least one
# run per N range must have migrated.
#   linked_programs.sh BUILD_DIR
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BUILD=${1:-}
fail() { echo "linked_programs: FAIL: $*" >&2; exit 1; }
note() { echo "linked_programs: $*" >&2; }
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem PROG=$BUILD/examples/opencl/separate_compilation
for f in "$TANDEMD" "$TANDEM" "$PROG"; do [[ -x $f ]] || fail "not built: $f"; done

source "$HERE/lib.sh"
OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS timeout 60 "$PROG" >"$work/native.out" ||
  fail "the native run failed"
start spare
# How many commands one run sends: the number the worker executes, from the client's stats.
TANDEM_SERVERS=${ADDR[spare]} TANDEM_STATS=1 timeout 60 "$TANDEM" run -- "$PROG" >"$work/count.out" 2>"$work/count.err" ||
  fail "the plain run failed"
total=$(awk '/^calls:/ { on = 1 } /^to servers:/ { on = 0 } on { for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9]+$/) t += $i } END { print t + 0 }' "$work/count.err")
[[ -n $total && $total -gt 20 ]] || { cat "$work/count.err" >&2; fail "no call count in TANDEM_STATS"; }
migrated=0
for frac in 30 50 65 80 90; do
  n=$((total * frac / 100))
  start a --inject-exit-after "$n"
  export TANDEM_SERVERS=${ADDR[a]} TANDEM_SPARE_SERVERS=${ADDR[spare]} TANDEM_CHECKPOINT_PERIOD=0
  TANDEM_LOG=info TANDEM_FAILOVER_TIMEOUT_MS=2000 timeout -k 5 120 "$TANDEM" run -- "$PROG" >"$work/run.out" 2>"$work/run.err"
  rc=$?
  ((rc == 0)) || fail "dying after $n of $total commands: the program failed (exit $rc)"
  cmp -s "$work/native.out" "$work/run.out" || { diff "$work/native.out" "$work/run.out" >&2; fail "dying after $n of $total commands: output differs"; }
  grep -q "took over" "$work/run.err" && ((++migrated))
  stop a
  unset TANDEM_SERVERS TANDEM_SPARE_SERVERS TANDEM_CHECKPOINT_PERIOD
done
((migrated >= 3)) || fail "only $migrated of 5 runs migrated: the deaths missed the run"
note "PASS: identical output in 5 runs whose server died at 30-90% of the run ($migrated migrated)"
