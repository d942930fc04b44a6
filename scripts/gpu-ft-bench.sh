#!/usr/bin/env bash
# DS-CUDA's fault-tolerance overhead table on the REMD example (bench/ft_overhead.sh): one
# replica per GPU on the 2-GPU kind, both replicas on the one GPU through MPS otherwise.
# Builds only what it needs.
#   device tool: run(command="bash scripts/gpu-ft-bench.sh", carry=[".deps"])
#                (or kind="nvidia-h200-x2" for the confirming run on two GPUs)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
B=${TANDEM_BUILD_DIR:-/tmp/tandem-gpu2}
mkdir -p "$OUT"
{ nvidia-smi -L; nproc; } 2>&1 | tee "$OUT/machine.txt"
cmake -S "$ROOT" -B "$B" -G Ninja -DTANDEM_WERROR=OFF >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
ninja -C "$B" tandemd tandem tandem_cudart tandem_opencl tandem_cuda_workloads >"$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
# (the CUDA fault-tolerance tests run in scripts/gpu-check.sh)
timeout 480 bash "$ROOT/bench/ft_overhead.sh" "$B" "$OUT/ft" "${REMD_STEPS:-300000}"
echo "ft_overhead: exit $?"
tar -czf "$OUT/ft-logs.tar.gz" -C "$OUT" ft 2>/dev/null && rm -rf "$OUT/ft/"*.log
