// Kernel launch: the configuration and every argument checked against the parameter layout
// the driver reported at FunctionGet, then cuLaunchKernel with a pointer to each argument.
#include <fmt/format.h>

#include "cuda_backend.h"

namespace tandem::server::cuda {

Status CudaBackend::OnLaunch(const ir::LaunchReq& req, ir::LaunchRep*) {
  auto it = functions_.find(req.function);
  if (it == functions_.end()) {
    if (orphaned_functions_.contains(req.function))
      return Status::Unknown(fmt::format("Launch: function {} belonged to a module that was freed", req.function));
    return Status::Unknown(fmt::format("Launch: unknown function {}", req.function));
  }
  const Function& f = it->second;
  if (req.dims < 1 || req.dims > 3) return Status::Invalid(fmt::format("Launch of {}: {} dimensions", f.name, req.dims));
  if (req.grid.size() != req.dims || req.block.size() != req.dims)
    return Status::Invalid(fmt::format("Launch of {}: {} dimensions but {} grid and {} block values", f.name, req.dims,
                                       req.grid.size(), req.block.size()));
  for (uint64_t o : req.offset)
    if (o != 0) return Status::Invalid(fmt::format("Launch of {}: CUDA has no global work offset", f.name));
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  for (uint32_t i = 0; i < req.dims; ++i) {
    if (req.grid[i] > UINT32_MAX || req.block[i] > UINT32_MAX)
      return Status::Invalid(fmt::format("Launch of {}: grid {} / block {} in dimension {} are too large", f.name,
                                         req.grid[i], req.block[i], i));
    grid[i] = static_cast<unsigned>(req.grid[i]);
    block[i] = static_cast<unsigned>(req.block[i]);
  }
  if (req.flags & ~uint32_t{ir::kLaunchCooperative})
    return Status::Invalid(fmt::format("Launch of {}: flags 0x{:x}", f.name, req.flags));
  if (req.args.size() != f.params.size())
    return Status::Invalid(fmt::format("Launch of {}: it takes {} parameters, the launch gives {}", f.name,
                                       f.params.size(), req.args.size()));
  // The driver only reads through kernelParams; it is void** for historical reasons.
  std::vector<void*> params(req.args.size());
  for (size_t i = 0; i < req.args.size(); ++i) {
    const ir::LaunchArg& a = req.args[i];
    if (a.kind != static_cast<uint32_t>(ir::ArgKind::kBytes))
      return Status::Invalid(fmt::format("Launch of {}: argument {} is not raw bytes (kind {})", f.name, i, a.kind));
    if (a.data.size() != f.params[i].size)
      return Status::Invalid(fmt::format("Launch of {}: argument {} has {} bytes, the parameter {}", f.name, i,
                                         a.data.size(), f.params[i].size));
    params[i] = const_cast<uint8_t*>(a.data.data());
  }
  auto q = ResolveStream(req.stream, f.device);
  if (!q.ok()) return q.status();
  if (q->device != f.device)
    return Status::Invalid(fmt::format("Launch of {}: stream {} is on device {}, the function on device {}", f.name,
                                       req.stream, q->device, f.device));
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));
  void** kernel_params = params.empty() ? nullptr : params.data();
  if (req.flags & ir::kLaunchCooperative) {
    TANDEM_RETURN_IF_ERROR(Check(q->device,
                                 drv_->cuLaunchCooperativeKernel(f.fn, grid[0], grid[1], grid[2], block[0], block[1],
                                                                 block[2], req.shared_bytes, q->stream, kernel_params),
                                 "cuLaunchCooperativeKernel"));
  } else {
    TANDEM_RETURN_IF_ERROR(Check(q->device,
                                 drv_->cuLaunchKernel(f.fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                                      req.shared_bytes, q->stream, kernel_params, nullptr),
                                 "cuLaunchKernel"));
  }
  return Signal(*q, req.signal);
}

}  // namespace tandem::server::cuda
