#!/usr/bin/env bash
# User events under redundancy (OpenCL; PoCL in CI): examples/opencl/user_events holds a
# kernel on a user event and reads back before it sets the event. The first read back is
# where fault tolerance takes its first checkpoint, whose DeviceSync waited for the held
# queue while the program, inside that read, could not set the event: the run hung. Now
# checkpoints wait while a user event is unset.
#   - two tandemd, TANDEM_REDUNDANCY=2: the program's stdout is identical to the native run
#     (lines starting with '#' aside) and both exit 0, within 60 s;
#   - the client's log says the checkpoint waited (so the case was met).
#
#   user_events.sh BUILD_DIR
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BUILD=${1:-}
fail() { echo "user_events: FAIL: $*" >&2; exit 1; }
note() { echo "user_events: $*" >&2; }
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem PROG=$BUILD/examples/opencl/user_events
for f in "$TANDEMD" "$TANDEM" "$PROG"; do [[ -x $f ]] || fail "not built: $f"; done

source "$HERE/lib.sh"
OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS timeout 60 "$PROG" >"$work/native.out" ||
  fail "the native run failed"
start a; start b
export TANDEM_SERVERS=${ADDR[a]},${ADDR[b]} TANDEM_REDUNDANCY=2
TANDEM_LOG=info timeout -k 5 60 "$TANDEM" run -- "$PROG" >"$work/run.out" 2>"$work/run.err"
rc=$?
((rc == 124 || rc == 137)) && fail "the program hung under redundancy (killed after 60 s)"
((rc == 0)) || fail "the program failed under redundancy (exit $rc)"
diff <(grep -v '^#' "$work/native.out") <(grep -v '^#' "$work/run.out") >&2 || fail "output differs from the native run"
grep -q "checkpoints wait while user events are unset" "$work/run.err" ||
  fail "no checkpoint was put off: the program no longer reads back while a user event is unset"
no_leaks a b
note "PASS: identical output under redundancy, the checkpoint waited for the user event"
