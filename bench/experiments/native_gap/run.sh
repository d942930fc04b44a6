#!/usr/bin/env bash
# Native launch + sync (CUDA) and enqueue + finish (OpenCL, NVIDIA's) with the calling thread
# idle between round trips, as tandemd's executor is between a client's batches; the OpenCL
# finish handed to a second thread as tandemd's waiter does; and both with K other threads
# spinning on the host, as the client's and tandemd's polling threads do (GPU machine, from
# the repository root):   bash bench/experiments/native_gap/run.sh [waits]
# `waits`: only the ways of waiting for an OpenCL kernel from a second thread (clFinish,
# clWaitForEvents on its event, polling its status) against the loop back to back.
set -u
here=bench/experiments/native_gap
gcc -O2 -I.deps/include -o /tmp/ocl_gap $here/ocl_gap.c -lOpenCL -lpthread && nvcc -O2 -o /tmp/cuda_gap $here/cuda_gap.cu || exit 1
source scripts/lib/opencl-vendors.sh
vendors=$(native_opencl_vendors /tmp/native-gap) || exit 1
export OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$(icd_libs "$vendors")
if [[ ${1:-} == waits ]]; then
  for round in 1 2 3; do
    for m in b2b event wspin wevent wmarker wpoll; do /tmp/ocl_gap $m 0; done
  done
  exit 0
fi
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))" | tr -s ' '
for round in 1 2; do
  for k in 0 2 4 8 12; do
    SPINNERS=$k /tmp/cuda_gap b2b 0
    SPINNERS=$k /tmp/ocl_gap b2b 0
  done
  for m in "spin 25" "sleep 25"; do
    /tmp/cuda_gap $m
    /tmp/ocl_gap $m
  done
  for m in waiter wspin wspinf; do
    /tmp/ocl_gap $m 0
    /tmp/ocl_gap $m 25
  done
  SPINNERS=4 /tmp/ocl_gap wspin 0
done
