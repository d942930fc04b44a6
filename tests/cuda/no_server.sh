#!/usr/bin/env bash
# no_server.sh LIB PROGRAM
# With no server named, a program still loads through the library (registration runs before
# main without touching the network), its first call fails with cudaErrorNoDevice, the
# reason is logged, and the dynamic linker has nothing to warn about.
set -u -o pipefail
lib=$1 prog=$2
out=$(env -u TANDEM_SERVERS LD_PRELOAD="$lib" timeout 60 "$prog" 2>&1); rc=$?
echo "$out"
fail=0
((rc == 1)) || { echo "expected exit code 1, got $rc"; fail=1; }
grep -q 'cudaErrorNoDevice' <<<"$out" || { echo "expected cudaErrorNoDevice"; fail=1; }
grep -q 'TANDEM_SERVERS' <<<"$out" || { echo "expected a log line naming TANDEM_SERVERS"; fail=1; }
grep -qi 'version information' <<<"$out" && { echo "the dynamic linker warned about versions"; fail=1; }
exit $fail
