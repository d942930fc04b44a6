#!/usr/bin/env bash
# The GPU machine's run, in one command: build everything, run the whole test suite there
# (the CUDA suite natively vs through Tandem, the CUDA backend tests, the OpenCL examples and
# clinfo against NVIDIA's OpenCL, the fabric/server/front-end tests) and the main job.
# Logs go to $OUT (the device tool's output folder) or ./gpu-out. Before it, on a machine
# with the -dev packages: bash scripts/device-deps.sh (the GPU machine lacks two headers).
#   device tool: run(command="bash scripts/gpu-check.sh", carry=[".deps"])
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
B=${TANDEM_BUILD_DIR:-/tmp/tandem-gpu}
mkdir -p "$OUT"
export POCL_CACHE_DIR=$B/pocl-cache
mkdir -p "$POCL_CACHE_DIR"

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
# Warnings are logged, not fatal, here: CI (-Werror, g++ 12) is where they must be zero.
cmake -S "$ROOT" -B "$B" -G Ninja -DTANDEM_WERROR=OFF >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
if ! ninja -C "$B" >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  exit 1
fi
grep -c "warning:" "$OUT/build.log" | sed 's/^/build warnings: /'

# TANDEM_GPU_CTEST_ARGS: extra ctest arguments (e.g. -E '^ft\.' to leave the slow fault-tolerance
# scenarios to a call of their own).
# shellcheck disable=SC2086
ctest --test-dir "$B" --timeout 300 -j8 --output-on-failure ${TANDEM_GPU_CTEST_ARGS:-} >"$OUT/ctest.log" 2>&1
rc=$?
cp "$B/Testing/Temporary/LastTest.log" "$OUT/LastTest.log" 2>/dev/null  # read below, then archived
# The CUDA suite's own summary (native vs Tandem per program).
grep -E "^(PASS|FAIL|SKIP)|passed, [0-9]+ failed" "$OUT/LastTest.log" | sort -u | head -60

TANDEM_SKIP_SETUP=1 TANDEM_BUILD_DIR=$B timeout 120 bash "$ROOT/scripts/run-main.sh" >"$OUT/main.log" 2>&1
echo "main job: exit $?"; tail -5 "$OUT/main.log"

# Tandem against native in the same run (ratios printed, never asserted). TANDEM_GPU_BENCH=0
# skips it (when the benchmark runs in a call of its own); TANDEM_GPU_BENCH_TIMEOUT bounds it
# (seconds, default 480).
# A warm machine keeps the build folder (and a local run its $OUT): an earlier call's table
# must not pass for this one's, printed or archived.
rm -rf "$B/bench-out" "$OUT/bench-table.txt" "$OUT/bench.json" "$OUT/bench.png" "$OUT/bench.log"
if [[ ${TANDEM_GPU_BENCH:-1} != 0 ]]; then
  timeout "${TANDEM_GPU_BENCH_TIMEOUT:-480}" bash "$ROOT/bench/run_bench.sh" "$B/server/tandemd" "$B/tools/tandem" "$B" "$B/bench-out" \
    >"$OUT/bench.log" 2>&1
  echo "bench: exit $?"
  cp "$B/bench-out/table.txt" "$OUT/bench-table.txt" 2>/dev/null && cat "$OUT/bench-table.txt"
  cp "$B/bench-out/bench.json" "$B/bench-out/bench.png" "$OUT/" 2>/dev/null
else
  echo "bench: skipped (TANDEM_GPU_BENCH=0)"
fi
# Everything else in one archive (the device tool returns at most 8 files).
tar -czf "$OUT/logs.tar.gz" -C "$B" Testing/Temporary bench-out -C "$OUT" build.log configure.log 2>/dev/null
rm -f "$OUT/LastTest.log" "$OUT/configure.log" "$OUT/build.log"

grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Timeout" "$OUT/ctest.log" | tail -30
exit $rc
