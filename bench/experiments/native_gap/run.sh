#!/usr/bin/env bash
# Native launch + sync (CUDA) and enqueue + finish (OpenCL, NVIDIA's) with the calling thread
# idle between round trips, as tandemd's executor is between a client's batches (GPU machine,
# from the repository root):   bash bench/experiments/native_gap/run.sh
set -u
here=bench/experiments/native_gap
gcc -O2 -I.deps/include -o /tmp/ocl_gap $here/ocl_gap.c -lOpenCL -lpthread && nvcc -O2 -o /tmp/cuda_gap $here/cuda_gap.cu || exit 1
source scripts/lib/opencl-vendors.sh
vendors=$(native_opencl_vendors /tmp/native-gap) || exit 1
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$(icd_libs "$vendors")
for round in 1 2; do
  for m in "b2b 0" "spin 25" "sleep 25" "spin 100" "sleep 100"; do
    /tmp/cuda_gap $m
    /tmp/ocl_gap $m
  done
  /tmp/ocl_gap waiter 0
  /tmp/ocl_gap waiter 25
done
