// Launch: arguments set from the IR's argument list, then clEnqueueNDRangeKernel with the
// global size (grid), optional local size (block) and optional global offset.
#include <fmt/format.h>

#include <array>
#include <cstring>

#include "opencl_backend.h"

namespace tandem::server::opencl {

// The kernel argument for a sub-buffer: a real clCreateSubBuffer of the range, so the
// device's own rules (alignment of the origin) apply exactly as natively.
Result<cl_mem> OpenCLBackend::SubBuffer(Buffer& b, uint64_t handle, const ir::bytes& range) {
  uint64_t origin = 0, size = 0;
  if (!ir::ParseSubRange(range, &origin, &size)) return Status::Invalid("a buffer argument's range is not 16 bytes");
  TANDEM_RETURN_IF_ERROR(CheckRange(b, handle, origin, size));
  if (size == 0) return Status::Invalid("a sub-buffer of 0 bytes");
  auto& view = b.views[{origin, size}];
  if (!view) {
    cl_buffer_region region{origin, size};
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateSubBuffer(b.mem.get(), 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    if (err != CL_SUCCESS) {
      b.views.erase({origin, size});
      return ClError(err, "clCreateSubBuffer", fmt::format("origin {} size {}", origin, size));
    }
    view.reset(m);
  }
  return view.get();
}
namespace {

Status CheckVector(const ir::u64s& v, uint32_t dims, bool optional, std::string_view what) {
  if (optional && v.empty()) return Status::Ok();
  if (v.size() != dims) return Status::Invalid(fmt::format("{} has {} values for {} dimensions", what, v.size(), dims));
  return Status::Ok();
}

}  // namespace

Status OpenCLBackend::OnLaunch(const ir::LaunchReq& req, ir::LaunchRep*) {
  auto f = Find(functions_, req.function, "function");
  if (!f.ok()) return f.status();
  Function& fn = *f.value();
  if (req.dims < 1 || req.dims > 3) return Status::Invalid(fmt::format("launch with {} dimensions (1 to 3)", req.dims));
  TANDEM_RETURN_IF_ERROR(CheckVector(req.grid, req.dims, false, "global size"));
  TANDEM_RETURN_IF_ERROR(CheckVector(req.block, req.dims, true, "local size"));
  TANDEM_RETURN_IF_ERROR(CheckVector(req.offset, req.dims, true, "global offset"));
  for (uint32_t i = 0; i < req.dims; ++i) {
    if (req.grid[i] == 0) return Status::Invalid(fmt::format("global size is 0 in dimension {}", i));
    if (!req.block.empty() && req.block[i] == 0)
      return Status::Invalid(fmt::format("local size is 0 in dimension {}", i));
  }
  if (req.shared_bytes != 0)
    return Status::Invalid("shared_bytes is CUDA's; OpenCL local memory is passed as local arguments");
  if (req.flags & ir::kLaunchCooperative)
    return Status(Code::kUnimplemented, "cooperative launches are CUDA's; OpenCL has no equivalent");
  if (req.flags & ~uint32_t{ir::kLaunchCooperative})
    return Status::Invalid(fmt::format("unknown launch flags {:#x}", req.flags));
  if (req.args.size() != fn.num_args)
    return Status::Invalid(fmt::format("kernel takes {} arguments, launch gives {}", fn.num_args, req.args.size()));
  for (uint32_t i = 0; i < req.dims; ++i) {
    if (!req.offset.empty() && req.offset[i] > UINT64_MAX - req.grid[i])
      return ClError(CL_INVALID_GLOBAL_OFFSET, "clEnqueueNDRangeKernel",
                     fmt::format("global offset {} + size {} overflows in dimension {}", req.offset[i], req.grid[i], i));
  }
  // What the device's enqueue answers for local memory it does not have (NVIDIA's), before
  // anything is set: each local argument and their sum, with the kernel's own, bounded.
  uint64_t local = fn.static_local;
  for (cl_uint i = 0; i < req.args.size(); ++i) {
    const ir::LaunchArg& a = req.args[i];
    if (static_cast<ir::ArgKind>(a.kind) != ir::ArgKind::kLocal) continue;
    if (a.value > fn.device_local || local + a.value > fn.device_local)
      return ClError(CL_OUT_OF_RESOURCES, "clEnqueueNDRangeKernel",
                     fmt::format("argument {} asks for {} bytes of local memory; the kernel has {} of the device's {}",
                                 i, a.value, local, fn.device_local));
    local += a.value;
  }

  // Arguments are checked and set in order; the kernel's argument state is this session's,
  // so one set to the same value by the previous launch is left as it is (each
  // clSetKernelArg costs about a microsecond on NVIDIA's OpenCL).
  fn.last_args.resize(fn.num_args);
  // Remembers what argument i is now set to; a failed set forgets it.
  // Compared and stored in place: no allocation once an argument has been set.
  auto setting = [&fn](cl_uint i, ir::ArgKind kind, const void* p, size_t n) {
    std::vector<uint8_t>& last = fn.last_args[i];
    const auto k = static_cast<uint8_t>(kind);
    if (last.size() == 1 + n && last[0] == k && (n == 0 || std::memcmp(last.data() + 1, p, n) == 0)) return false;
    last.resize(1 + n);
    last[0] = k;
    if (n) std::memcpy(last.data() + 1, p, n);
    return true;
  };
  for (cl_uint i = 0; i < req.args.size(); ++i) {
    const ir::LaunchArg& a = req.args[i];
    const auto kind = static_cast<ir::ArgKind>(a.kind);
    if (kind != ir::ArgKind::kBytes && kind != ir::ArgKind::kBuffer && !a.data.empty())
      return Status::Invalid(fmt::format("argument {}: only byte and buffer arguments carry data", i));
    cl_int err = CL_SUCCESS;
    switch (kind) {
      case ir::ArgKind::kBytes:
        if (a.data.empty()) return Status::Invalid(fmt::format("argument {}: empty value", i));
        if (setting(i, kind, a.data.data(), a.data.size()))
          err = clSetKernelArg(fn.kernel.get(), i, a.data.size(), a.data.data());
        break;
      case ir::ArgKind::kBuffer: {
        auto b = Find(buffers_, a.value, "buffer");
        if (!b.ok()) return Status(b.status().code(), fmt::format("argument {}: {}", i, b.status().message()));
        if (b.value()->device != fn.device)
          return Status::Invalid(fmt::format("argument {}: buffer {:#x} is on device {}, the kernel on device {}", i,
                                             a.value, b.value()->device, fn.device));
        cl_mem mem = b.value()->mem.get();
        if (!a.data.empty()) {
          auto view = SubBuffer(*b.value(), a.value, a.data);
          if (!view.ok()) return Status(view.status().code(), fmt::format("argument {}: {}", i, view.status().message()),
                                        view.status().native(), view.status().api());
          mem = view.value();
        }
        if (setting(i, kind, &mem, sizeof mem)) err = clSetKernelArg(fn.kernel.get(), i, sizeof(cl_mem), &mem);
        break;
      }
      case ir::ArgKind::kLocal:
        if (a.value == 0) return Status::Invalid(fmt::format("argument {}: local memory of 0 bytes", i));
        if (setting(i, kind, &a.value, sizeof a.value)) err = clSetKernelArg(fn.kernel.get(), i, a.value, nullptr);
        break;
      case ir::ArgKind::kNullBuffer: {
        cl_mem none = nullptr;
        if (setting(i, kind, nullptr, 0)) err = clSetKernelArg(fn.kernel.get(), i, sizeof(cl_mem), &none);
        break;
      }
      default:
        return Status::Invalid(fmt::format("argument {}: unknown kind {}", i, a.kind));
    }
    if (err != CL_SUCCESS) {
      fn.last_args[i].clear();
      return ClError(err, "clSetKernelArg", fmt::format("argument {}", i));
    }
  }

  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, fn.device, req.wait, req.signal, &e));
  std::array<size_t, 3> grid{}, block{}, offset{};
  for (uint32_t i = 0; i < req.dims; ++i) {
    grid[i] = req.grid[i];
    if (!req.block.empty()) block[i] = req.block[i];
    if (!req.offset.empty()) offset[i] = req.offset[i];
  }
  cl_int err = clEnqueueNDRangeKernel(e.queue, fn.kernel.get(), req.dims, req.offset.empty() ? nullptr : offset.data(),
                                      grid.data(), req.block.empty() ? nullptr : block.data(), e.num_wait(),
                                      e.wait_list(), e.event_out(TraceClTimes()));
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueNDRangeKernel");
  if (TraceClTimes()) TraceTimes(e.done, fmt::format("kernel {:#x} on stream {:#x}", req.function, req.stream));
  Complete(e);
  return Status::Ok();
}

}  // namespace tandem::server::opencl
