// Keepalive (ir Warm): a small copy to the device and back and/or an empty kernel, on a
// stream of its own so it never orders against the program's work. The kernel and the
// device scratch come from a tiny PTX module, JIT-compiled when the session's context on the
// device is made.
#include <fmt/format.h>

#include <cstring>

#include "cuda_backend.h"
#include "tandem/log.h"

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

// Made with the context, not on the first Warm: the module's global takes device address
// space, and a keepalive arrives when the link has been quiet, at a moment no replica shares.
// Loaded lazily, it moved every module global the program loaded after it, so replicas of a
// fault-tolerant client (which address a global by the primary's address) could disagree, and
// a spare replaying the log would place globals where no Warm had gone before. A failure here
// only disables the keepalive on the device: OnWarm answers it.
void CudaBackend::LoadWarm(uint32_t device) {
  Device& d = devices_[device];
  CUstream stream = nullptr;
  Status st = Check(device, drv_->cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
  CUmodule module = nullptr;
  if (st.ok()) st = Check(device, drv_->cuModuleLoadData(&module, kWarmPtx), "cuModuleLoadData (keepalive)");
  CUfunction kernel = nullptr;
  CUdeviceptr scratch = 0;
  size_t size = 0;
  if (st.ok()) st = Check(device, drv_->cuModuleGetFunction(&kernel, module, "tandem_warm_empty"), "cuModuleGetFunction");
  if (st.ok()) st = Check(device, drv_->cuModuleGetGlobal(&scratch, &size, module, "tandem_warm_scratch"), "cuModuleGetGlobal");
  if (!st.ok()) {
    if (module) Forget("cuModuleUnload", device, drv_->cuModuleUnload(module));
    if (stream) Forget("cuStreamDestroy", device, drv_->cuStreamDestroy(stream));
    log::Warn("device {}: no keepalive on this device: {}", device, st.message());
    d.warm_error = st;
    return;
  }
  d.warm_stream = stream;
  d.warm_module = module;
  d.warm_kernel = kernel;
  d.warm_scratch = scratch;
  d.warm_error = Status::Ok();
}

Status CudaBackend::OnWarm(const ir::WarmReq& req, ir::WarmRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  Device& d = devices_[device];
  if (!d.warm_stream)
    return d.warm_error.ok() ? Status(Code::kInternal, fmt::format("device {}: no keepalive resources", device)) : d.warm_error;
  const size_t n = req.data.size();
  // The session refuses more (Session::Call(WarmReq)); the copy below goes through a buffer of
  // this size, so the backend checks too (cuda_backend_fuzz called it directly with more).
  if (n > ir::kWarmMaxBytes || (req.what & ~(ir::kWarmCopy | ir::kWarmKernel)))
    return Status::Invalid(fmt::format("Warm: {} bytes (at most {}), paths {:#x}", n, ir::kWarmMaxBytes, req.what));
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
