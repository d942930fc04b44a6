// Keepalive (ir Warm): a small copy to the device and back and/or an empty kernel, on a
// stream of its own so it never orders against the program's work. The kernel and the
// device scratch come from a tiny PTX module (JIT-compiled once per device).
#include <fmt/format.h>

#include <cstring>

#include "cuda_backend.h"

namespace tandem::server::cuda {
namespace {

constexpr char kWarmPtx[] = R"PTX(
.version 6.0
.target sm_52
.address_size 64
.visible .global .align 8 .b8 tandem_warm_scratch[64];
.visible .entry tandem_warm_empty()
{
	ret;
}
)PTX";

}  // namespace

Status CudaBackend::OnWarm(const ir::WarmReq& req, ir::WarmRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  Device& d = devices_[device];
  if (!d.warm_stream) {
    CUstream stream = nullptr;
    TANDEM_RETURN_IF_ERROR(
        Check(device, drv_->cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority"));
    CUmodule module = nullptr;
    Status st = Check(device, drv_->cuModuleLoadData(&module, kWarmPtx), "cuModuleLoadData (keepalive)");
    CUfunction kernel = nullptr;
    CUdeviceptr scratch = 0;
    size_t size = 0;
    if (st.ok()) st = Check(device, drv_->cuModuleGetFunction(&kernel, module, "tandem_warm_empty"), "cuModuleGetFunction");
    if (st.ok()) st = Check(device, drv_->cuModuleGetGlobal(&scratch, &size, module, "tandem_warm_scratch"), "cuModuleGetGlobal");
    if (!st.ok()) {
      if (module) Forget("cuModuleUnload", device, drv_->cuModuleUnload(module));
      Forget("cuStreamDestroy", device, drv_->cuStreamDestroy(stream));
      return st;
    }
    d.warm_stream = stream;
    d.warm_module = module;
    d.warm_kernel = kernel;
    d.warm_scratch = scratch;
  }
  const size_t n = req.data.size();
  // Copies go through pageable memory, as the program's reads do here (an inline read lands in
  // the reply's bytes): pinned warm-ups kept that path no warmer (H100, 2026-11-24).
  const CUstream stream = d.warm_stream;
  uint8_t host[ir::kWarmMaxBytes];
  if ((req.what & ir::kWarmCopy) && n > 0) {
    std::memcpy(host, req.data.data(), n);
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemcpyHtoDAsync(d.warm_scratch, host, n, stream), "cuMemcpyHtoDAsync"));
  }
  if (req.what & ir::kWarmKernel) {
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuLaunchKernel(d.warm_kernel, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr),
                                 "cuLaunchKernel (keepalive)"));
  }
  if ((req.what & ir::kWarmCopy) && n > 0) {
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemcpyDtoHAsync(host, d.warm_scratch, n, stream), "cuMemcpyDtoHAsync"));
  }
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuStreamSynchronize(stream), "cuStreamSynchronize"));
  rep->data.assign(host, host + ((req.what & ir::kWarmCopy) ? n : 0));
  return Status::Ok();
}

}  // namespace tandem::server::cuda
