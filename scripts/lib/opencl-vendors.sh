# Sourced by scripts/run-main.sh, tests/e2e/e2e.sh and bench/run_bench.sh: which OpenCL is
# this machine's own, and how to pin both ICD loaders to it.

# native_opencl_vendors WORKDIR: prints an .icd file or folder (or a .so) for ocl-icd's
# OCL_ICD_VENDORS: $TANDEM_NATIVE_OPENCL if set; else NVIDIA's (writing an .icd into
# WORKDIR when the driver ships libnvidia-opencl.so.1 without one, as on an offline GPU
# machine); else PoCL's. Fails when there is none.
native_opencl_vendors() {
  local work=$1
  if [[ -n ${TANDEM_NATIVE_OPENCL:-} ]]; then echo "$TANDEM_NATIVE_OPENCL"; return 0; fi
  if [[ -e /etc/OpenCL/vendors/nvidia.icd ]]; then echo /etc/OpenCL/vendors/nvidia.icd; return 0; fi
  if ldconfig -p 2>/dev/null | grep 'libnvidia-opencl\.so\.1 ' >/dev/null; then  # no grep -q: SIGPIPE + pipefail
    mkdir -p "$work/vendors"
    echo libnvidia-opencl.so.1 >"$work/vendors/nvidia.icd"
    echo "$work/vendors"
    return 0
  fi
  if [[ -e /etc/OpenCL/vendors/pocl.icd ]]; then echo /etc/OpenCL/vendors/pocl.icd; return 0; fi
  echo "no native OpenCL: install pocl-opencl-icd or set TANDEM_NATIVE_OPENCL" >&2
  return 1
}

# icd_libs VENDORS: the libraries those .icd files name, ':'-separated, for
# OCL_ICD_FILENAMES. Debian's ocl-icd reads only OCL_ICD_VENDORS, while the Khronos loader
# (CUDA ships one; on the GPU machine it is the libOpenCL.so.1 programs load) ignores it
# and loads exactly OCL_ICD_FILENAMES when set: pin both.
icd_libs() {
  local f out=""
  if [[ -d $1 ]]; then
    for f in "$1"/*.icd; do [[ -e $f ]] && out+=${out:+:}$(head -n1 "$f"); done
  elif [[ $1 == *.icd ]]; then
    out=$(head -n1 "$1")
  else
    out=$1
  fi
  echo "$out"
}
