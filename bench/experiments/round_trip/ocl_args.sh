#!/usr/bin/env bash
# ocl_args natively (NVIDIA's OpenCL) and through one OpenCL tandemd over tcp, ROUNDS times
# each, alternating: plain, after a burst of enqueues, with a 256 MiB buffer, and with that
# buffer written first (the benchmark's set-up); then opencl_bench's two enqueue rows,
# natively and through the same tandemd (GPU machine, from the repository root):
#   run(command="bash bench/experiments/round_trip/ocl_args.sh [ROUNDS] [N]", carry=[".deps"])
set -u
ROUNDS=${1:-3} COUNT=${2:-2000}
source bench/experiments/lib.sh
N=/tmp/ocl-args-build W=/tmp/ocl-args-work
rm -rf "$W" && mkdir -p "$W"
build_tree . "$N" "$W" new "tandemd tandem tandem_opencl opencl_bench" -DTANDEM_CUDA_PROGRAMS=OFF || exit 1
here=bench/experiments/round_trip
cc -O2 -o "$W/ocl_args" $here/ocl_args.c -lOpenCL || exit 1
experiment_env "$W"
declare -A addr
start_server_as tcp "$N/server/tandemd" opencl "$W/tandemd.log" || exit 1
# Each variant: the environment ocl_args runs with and its second argument.
variants=("plain|" "burst|burst" "256MiB|OCL_ARGS_BYTES=268435456" "256MiB+write|OCL_ARGS_BYTES=268435456 OCL_ARGS_WRITE=1")
for r in $(seq "$ROUNDS"); do
  for v in "${variants[@]}"; do
    name=${v%%|*} how=${v#*|} mode= envs=()
    for w in $how; do if [[ $w == *=* ]]; then envs+=("$w"); else mode=$w; fi; done
    echo "round $r $name native: $(env "${envs[@]}" OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs "$W/ocl_args" "$COUNT" $mode | tr '\n' ' ')"
    echo "round $r $name tandem: $(env "${envs[@]}" "$N/tools/tandem" run --servers "${addr[tcp]}" -- "$W/ocl_args" "$COUNT" $mode 2>&1 | grep -v '^\[tandem' | tr '\n' ' ')"
  done
done
echo "opencl_bench native: $(OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$libs timeout 120 "$N/bench/opencl_bench" --no-idle 2>/dev/null | grep ocl_enqueue | tr '\n' ' ')"
echo "opencl_bench tandem: $(timeout 120 "$N/tools/tandem" run --servers "${addr[tcp]}" -- "$N/bench/opencl_bench" --no-idle 2>/dev/null | grep ocl_enqueue | tr '\n' ' ')"
