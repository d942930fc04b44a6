#!/usr/bin/env bash
# Transient link loss end to end, on real tandemd servers over 127.0.0.1 (OpenCL backend over
# the machine's native OpenCL: PoCL in CI; FT_API=cuda: the CUDA backend and the CUDA variant
# of the program, on a GPU only). The program (iterate, see ft.sh) runs natively
# once, then through Tandem while its connection to its session worker is cut several times
# under it (TANDEM_TEST_CUT_LINK_AFTER, a test-only client setting: the client closes its
# fabric connection after every N-th batch it sent). The session must be resumed on the same
# worker each time (Resume; unacknowledged batches resent once, duplicates dropped):
#   - stdout byte-identical to the native run;
#   - TANDEM_STATS=1: reconnects counted, no migration, no rollback;
#   - the client's log shows each reconnect, the server's log each resume;
#   - run once with no fault tolerance at all, once with TANDEM_SPARE_SERVERS naming a
#     second server (which must never be used: no migration happened), and once more with
#     a large write and a whole-state read back every round (--bulk-every 1: transfers that
#     go by RMA, so cuts fall between an RMA request and its transfer);
#   - the same bulk program on a server that drops the connection itself in the middle of
#     every N-th RMA transfer (tandemd --inject-cut-bulk-every N): each cut transfer is done
#     again on the resumed connection;
#   - afterwards the server still serves and holds no session.
#
#   linkcut.sh BUILD_DIR
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BUILD=${1:-}
fail() { echo "linkcut: FAIL: $*" >&2; exit 1; }
note() { echo "linkcut: $*" >&2; }
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem PROG=$BUILD/tests/ft/ft_iterate
API=${FT_API:-opencl}
if [[ $API == cuda ]]; then
  nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "linkcut: no GPU: CUDA variant skipped" >&2; exit 77; }
  PROG=$BUILD/tests/ft/ft_iterate_cuda
fi
for f in "$TANDEMD" "$TANDEM" "$PROG"; do [[ -x $f ]] || fail "not built: $f"; done

SERVER_ENV=TANDEM_LOG=info  # the server's log shows each resume
source "$HERE/lib.sh"
ROUNDS=${LINKCUT_ROUNDS:-200}
ARGS=(--rounds "$ROUNDS" --sleep-ms "${LINKCUT_SLEEP_MS:-2}")
CUT_EVERY=${LINKCUT_EVERY:-60}  # batches between two cuts
CUTS=${LINKCUT_TIMES:-4}

stat_of() { grep -o "[0-9]* $2" "$1" | grep -o "^[0-9]*" | head -1; }

native() { OCL_ICD_VENDORS=$NATIVE OCL_ICD_FILENAMES=$NATIVE_LIBS timeout 300 "$PROG" "$@"; }
native "${ARGS[@]}" >"$work/native.out" || fail "the native run failed"
[[ $(grep -c '^round' "$work/native.out") -ge 4 ]] || fail "the native run printed too little"

start a
start spare

BULK_ARGS=(--rounds "${LINKCUT_BULK_ROUNDS:-60}" --sleep-ms 1 --bulk-every 1)
native "${BULK_ARGS[@]}" >"$work/native-bulk.out" || fail "the native bulk run failed"

# run NAME [VAR=VALUE...]: the program through Tandem on server a, its link cut CUTS times
# (with PROG_ARGS instead of ARGS and EXPECT instead of native.out when set).
run() {
  local name=$1 rc; shift
  local -a args=("${ARGS[@]}")
  [[ -n ${PROG_ARGS:-} ]] && read -ra args <<<"$PROG_ARGS"
  env TANDEM_STATS=1 TANDEM_SERVERS="${ADDR[a]}" TANDEM_TEST_CUT_LINK_AFTER="$CUT_EVERY" \
    TANDEM_TEST_CUT_LINK_TIMES="$CUTS" "$@" timeout -k 5 240 "$TANDEM" run -- "$PROG" "${args[@]}" \
    >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  ((rc == 0)) || fail "$name: the program failed (exit $rc)"
  cmp -s "$work/${EXPECT:-native.out}" "$work/$name.out" ||
    { diff "$work/${EXPECT:-native.out}" "$work/$name.out" | head -20 >&2; fail "$name: output differs from the native run"; }
  local lost reconnected stat migrations rollbacks
  lost=$(grep -c "test: cutting the link" "$work/$name.err")
  reconnected=$(grep -c "reconnected to its session worker" "$work/$name.err")
  stat=$(stat_of "$work/$name.err" "reconnects to a live session worker")
  migrations=$(stat_of "$work/$name.err" "migrations")
  rollbacks=$(stat_of "$work/$name.err" "rollbacks")
  note "$name: identical output; $lost cuts, $reconnected reconnects (stats: ${stat:-0}), migrations: ${migrations:-0}, rollbacks: ${rollbacks:-0}"
  ((lost >= 2)) || fail "$name: only $lost cuts happened: lower LINKCUT_EVERY"
  ((reconnected == lost)) || fail "$name: $lost cuts but $reconnected reconnects"
  ((${stat:-0} == lost)) || fail "$name: TANDEM_STATS counts ${stat:-0} reconnects, the log $lost"
  ((${migrations:-0} == 0)) || fail "$name: $migrations migrations"
  ((${rollbacks:-0} == 0)) || fail "$name: $rollbacks rollbacks"
  grep -q "took over\|lost server" "$work/$name.err" && fail "$name: a server was given up"
  no_leaks a spare
}

run plain
# With fault tolerance armed (a spare, checkpoints): a resumed link must not migrate.
run spare TANDEM_SPARE_SERVERS="${ADDR[spare]}" TANDEM_CHECKPOINT_PERIOD=0.5
# The spare holds a standby session from the start (it takes over without starting a worker),
# so a session there proves nothing; run() fails on any migration, rollback or takeover.
# Cuts between large transfers' requests and their RMA: every batch of a round carries one.
PROG_ARGS="${BULK_ARGS[*]}" EXPECT=native-bulk.out CUT_EVERY=${LINKCUT_BULK_EVERY:-7} run bulk

# Cuts in the middle of RMA transfers, made by the server.
start cutter --inject-cut-bulk-every "${LINKCUT_BULK_CUT_EVERY:-25}"
env TANDEM_STATS=1 TANDEM_SERVERS="${ADDR[cutter]}" timeout -k 5 240 "$TANDEM" run -- "$PROG" "${BULK_ARGS[@]}" \
  >"$work/midrma.out" 2>"$work/midrma.err" || fail "midrma: the program failed"
cmp -s "$work/native-bulk.out" "$work/midrma.out" ||
  { diff "$work/native-bulk.out" "$work/midrma.out" | head -20 >&2; fail "midrma: output differs from the native run"; }
cuts=$(grep -c "fault injection: dropping the client's connection during bulk transfer" "$work/cutter.log")
redone=$(grep -c "a bulk transfer cut by a link loss is done again" "$work/cutter.log")
reconnected=$(grep -c "reconnected to its session worker" "$work/midrma.err")
migrations=$(stat_of "$work/midrma.err" migrations) rollbacks=$(stat_of "$work/midrma.err" rollbacks)
note "midrma: identical output; $cuts cuts in RMA transfers, $redone transfers done again, $reconnected reconnects," \
  "migrations: ${migrations:-0}, rollbacks: ${rollbacks:-0}"
((cuts >= 2)) || fail "midrma: only $cuts cuts happened"
((redone == cuts)) || fail "midrma: $cuts transfers cut but $redone done again"
((reconnected == cuts)) || fail "midrma: $cuts cuts but $reconnected reconnects"
((${migrations:-0} == 0 && ${rollbacks:-0} == 0)) || fail "midrma: migrated or rolled back"
no_leaks cutter

resumed=$(grep -c "client resumed after" "$work/a.log")
note "server a logged $resumed resumes"
((resumed >= 4)) || fail "server a logged only $resumed resumes"

# The server still serves.
"$TANDEM" info --servers "${ADDR[a]}" >/dev/null 2>&1 || fail "server a does not answer after the runs"
no_leaks a spare
note "PASS"
