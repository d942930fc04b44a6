#!/usr/bin/env bash
# static_cudart.sh LIB PROGRAM
# A program built with nvcc's default static runtime cannot be served by Tandem: loading the
# library into it prints one message telling the user to rebuild with -cudart shared.
set -u -o pipefail
lib=$1 prog=$2
out=$(env -u TANDEM_SERVERS LD_PRELOAD="$lib" timeout 60 "$prog" 2>&1)
echo "$out"
n=$(grep -c -- '-cudart shared' <<<"$out")
((n == 1)) || { echo "expected one message naming -cudart shared, got $n"; exit 1; }
