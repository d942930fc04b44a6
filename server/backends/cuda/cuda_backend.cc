// The CUDA backend's entry point, its devices and their contexts. The other command
// families live beside this file: cuda_memory.cc, cuda_transfer.cc, cuda_module.cc,
// cuda_launch.cc, cuda_events.cc.
#include "tandem/server/backend.h"

#if defined(TANDEM_CUDA_BACKEND)

#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "cuda_backend.h"
#include "tandem/log.h"

namespace tandem::server {
namespace cuda {
namespace {

void AddProp(ir::PropList* props, uint32_t key, uint64_t value, size_t bytes) {
  ir::Prop p{key, {}};
  for (size_t i = 0; i < bytes; ++i) p.value.push_back(static_cast<uint8_t>(value >> (8 * i)));
  props->push_back(std::move(p));
}

}  // namespace

Result<std::vector<CUdevice>> SelectDevices(const Driver& drv, const std::string& filter) {
  int count = 0;
  TANDEM_RETURN_IF_ERROR(drv.Check(drv.cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (count <= 0) return Status(Code::kUnimplemented, "the CUDA driver reports no device");
  std::vector<int> ordinals;
  if (filter.empty()) {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  } else {
    // A comma-separated list of driver ordinals, each at most once.
    for (size_t at = 0; at <= filter.size();) {
      size_t end = filter.find(',', at);
      if (end == std::string::npos) end = filter.size();
      int v = -1;
      auto [ptr, ec] = std::from_chars(filter.data() + at, filter.data() + end, v);
      if (ec != std::errc() || ptr != filter.data() + end || v < 0 || v >= count)
        return Status::Invalid(fmt::format("--devices '{}': '{}' is not a CUDA device (0..{})", filter,
                                           filter.substr(at, end - at), count - 1));
      for (int o : ordinals)
        if (o == v) return Status::Invalid(fmt::format("--devices '{}' names device {} twice", filter, v));
      ordinals.push_back(v);
      at = end + 1;
    }
  }
  std::vector<CUdevice> devices;
  for (int o : ordinals) {
    CUdevice d;
    TANDEM_RETURN_IF_ERROR(drv.Check(drv.cuDeviceGet(&d, o), "cuDeviceGet"));
    devices.push_back(d);
  }
  return devices;
}

CudaBackend::CudaBackend(const Driver* driver, std::vector<CUdevice> devices, std::unique_ptr<OutputCapture> output)
    : drv_(driver), output_(std::move(output)) {
  for (CUdevice d : devices) devices_.push_back(Device{.dev = d});
}

// Nothing here waits for the device: a stream may be held for good by a user event the
// program never set. Every device's user events are set first, so no stream still waits
// when an earlier device's context goes.
CudaBackend::~CudaBackend() {
  for (uint32_t i = 0; i < devices_.size(); ++i)
    if (devices_[i].ctx) ReleaseUserFlags(i);
  for (uint32_t i = 0; i < devices_.size(); ++i) ReleaseDevice(i, false);
}

std::vector<std::pair<uint32_t, std::string>> CudaBackend::TakeOutput() {
  std::string text = output_->Take();
  if (text.empty()) return {};
  return {{1u, std::move(text)}};
}

Status CudaBackend::CheckDevice(uint64_t device) const {
  if (device >= devices_.size())
    return Status::Invalid(fmt::format("no CUDA device {} (this server has {})", device, devices_.size()));
  return Status::Ok();
}

Status CudaBackend::Enter(uint32_t device) {
  Device& d = devices_[device];
  if (!d.sticky.ok()) return d.sticky;
  if (!d.ctx) {
    CUcontext ctx = nullptr;
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuDevicePrimaryCtxRetain(&ctx, d.dev), "cuDevicePrimaryCtxRetain"));
    d.ctx = ctx;
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent"));
    LoadWarm(device);
    return Status::Ok();
  }
  return Check(device, drv_->cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
}

Status CudaBackend::Check(uint32_t device, CUresult r, std::string_view call) {
  Status st = drv_->Check(r, call);
  if (IsSticky(r) && devices_[device].sticky.ok()) {
    devices_[device].sticky =
        Status(st.code(), st.message() + " (sticky: every later command on this device fails with it)", st.native(),
               st.api());
  }
  return st;
}

void CudaBackend::Forget(const char* what, uint32_t device, CUresult r) {
  if (r != CUDA_SUCCESS) log::Debug("device {}: {} during teardown: {}", device, what, drv_->Check(r, what).message());
}

// Frees every resource of the session on the device, then lets go of its context. Errors
// are expected here after a sticky failure and only logged: the context goes away anyway.
// The user-event words are freed with the context itself, since a stream may still be
// reading them; the pinned pool's blocks lose their registration with it and stay the
// process's memory.
std::vector<uint8_t*> CudaBackend::ReleaseDevice(uint32_t device, bool keep_reservations) {
  Device& d = devices_[device];
  if (!d.ctx) return {};
  Forget("cuCtxSetCurrent", device, drv_->cuCtxSetCurrent(d.ctx));
  ReleaseUserFlags(device);
  {
    std::lock_guard<std::mutex> lock(user_mu_);
    std::erase_if(user_events_, [&](const auto& e) { return e.second.device == device; });
  }
  std::erase_if(events_, [&](const auto& e) {
    if (e.second.device != device) return false;
    Forget("cuEventDestroy", device, drv_->cuEventDestroy(e.second.event));
    return true;
  });
  std::erase_if(streams_, [&](const auto& s) {
    if (s.second.device != device) return false;
    Forget("cuStreamDestroy", device, drv_->cuStreamDestroy(s.second.stream));
    return true;
  });
  std::erase_if(functions_, [&](const auto& f) { return f.second.device == device; });
  std::erase_if(modules_, [&](const auto& m) {
    if (m.second.device != device) return false;
    for (uint64_t g : m.second.globals) ranges_.erase(g);
    Forget("cuModuleUnload", device, drv_->cuModuleUnload(m.second.mod));
    return true;
  });
  std::erase_if(buffers_, [&](const auto& b) {
    if (b.second.device != device) return false;
    Status st = FreeAllocation(b.second);
    if (!st.ok()) log::Debug("device {}: freeing buffer {} during teardown: {}", device, b.first, st.message());
    return true;
  });
  for (CUevent& e : d.slot_done) {
    if (e) Forget("cuEventDestroy", device, drv_->cuEventDestroy(e));
    e = nullptr;
  }
  d.staging.reset();
  d.read_buffer.reset();
  d.read_buffer_failed = false;
  d.flags = {};
  if (d.warm_stream) Forget("cuStreamDestroy", device, drv_->cuStreamDestroy(d.warm_stream));
  if (d.warm_module) Forget("cuModuleUnload", device, drv_->cuModuleUnload(d.warm_module));
  d.warm_stream = nullptr;
  d.warm_module = nullptr;
  d.warm_kernel = nullptr;
  d.warm_scratch = 0;
  d.warm_error = Status::Ok();
  // Callbacks still queued on it run (with the reset's status) as the stream goes.
  if (d.notify_stream) Forget("cuStreamDestroy", device, drv_->cuStreamDestroy(d.notify_stream));
  d.notify_stream = nullptr;
  for (auto it = reservations_.begin(); !keep_reservations && it != reservations_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    Forget("cuMemAddressFree", device, drv_->cuMemAddressFree(it->first, it->second.size));
    it = reservations_.erase(it);
  }
  Forget("cuDevicePrimaryCtxRelease", device, drv_->cuDevicePrimaryCtxRelease(d.dev));
  d.ctx = nullptr;
  return Unpin(device);
}

// ---- device commands -----------------------------------------------------------------------

// Everything the front end needs for cudaDeviceProp and cudaDeviceGetAttribute, without a
// context: every attribute the driver answers, then memory, UUID and driver version.
Status CudaBackend::OnDeviceInfo(const ir::DeviceInfoReq& req, ir::DeviceInfoRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.index));
  const CUdevice dev = devices_[req.index].dev;
  char name[256] = {};
  TANDEM_RETURN_IF_ERROR(drv_->Check(drv_->cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName"));
  rep->api = static_cast<uint32_t>(Api::kCuda);
  rep->name = name;
  rep->platform = "CUDA";
  // Attributes this driver does not know answer CUDA_ERROR_INVALID_VALUE and are left out.
  for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int v = 0;
    if (drv_->cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), dev) == CUDA_SUCCESS)
      AddProp(&rep->props, ir::kCudaAttrBase + a, static_cast<uint32_t>(v), 4);
  }
  size_t total = 0;
  TANDEM_RETURN_IF_ERROR(drv_->Check(drv_->cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem"));
  AddProp(&rep->props, ir::kCudaTotalMem, total, 8);
  CUuuid uuid;
  TANDEM_RETURN_IF_ERROR(drv_->Check(drv_->cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid"));
  rep->props.push_back(ir::Prop{ir::kCudaUuid, ir::bytes(uuid.bytes, uuid.bytes + sizeof(uuid.bytes))});
  AddProp(&rep->props, ir::kCudaDriverVersion, static_cast<uint32_t>(drv_->version), 4);
  // kCudaLuid stays absent: device LUIDs exist only on Windows.
  // A driver that will not say leaves the bus id absent (the client answers not supported).
  char bus_id[64] = {};
  if (drv_->cuDeviceGetPCIBusId(bus_id, sizeof(bus_id) - 1, dev) == CUDA_SUCCESS)
    rep->props.push_back(ir::Prop{ir::kCudaPciBusId, ir::bytes(bus_id, bus_id + std::strlen(bus_id))});
  return Status::Ok();
}

Status CudaBackend::OnDeviceSync(const ir::DeviceSyncReq& req, ir::DeviceSyncRep*) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  return Check(device, drv_->cuCtxSynchronize(), "cuCtxSynchronize");
}

// Asked of the device's context (made on first use), as cudaDeviceGetStreamPriorityRange does.
Status CudaBackend::OnPriorityRange(const ir::PriorityRangeReq& req, ir::PriorityRangeRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  int least = 0, greatest = 0;
  TANDEM_RETURN_IF_ERROR(
      Check(device, drv_->cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange"));
  rep->least = least;
  rep->greatest = greatest;
  return Status::Ok();
}

// CUlimit values are checked by the driver, which also refuses some limits once kernels ran.
Status CudaBackend::OnDeviceSetLimit(const ir::DeviceSetLimitReq& req, ir::DeviceSetLimitRep*) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  return Check(device, drv_->cuCtxSetLimit(static_cast<CUlimit>(req.limit), req.value), "cuCtxSetLimit");
}

Status CudaBackend::OnDeviceGetLimit(const ir::DeviceGetLimitReq& req, ir::DeviceGetLimitRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  size_t value = 0;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuCtxGetLimit(&value, static_cast<CUlimit>(req.limit)), "cuCtxGetLimit"));
  rep->value = value;
  return Status::Ok();
}

Status CudaBackend::OnDeviceSetCacheConfig(const ir::DeviceSetCacheConfigReq& req, ir::DeviceSetCacheConfigRep*) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  if (req.config > CU_FUNC_CACHE_PREFER_EQUAL) return Status::Invalid(fmt::format("cache configuration {}", req.config));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  return Check(device, drv_->cuCtxSetCacheConfig(static_cast<CUfunc_cache>(req.config)), "cuCtxSetCacheConfig");
}

Status CudaBackend::OnMemInfo(const ir::MemInfoReq& req, ir::MemInfoRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  size_t free = 0, total = 0;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemGetInfo(&free, &total), "cuMemGetInfo"));
  rep->free = free;
  rep->total = total;
  return Status::Ok();
}

// cudaDeviceReset: frees every resource of the session on the device and resets its
// primary context. The address ranges the client reserved stay reserved at the same
// addresses, so its pointers stay meaningful whether or not it sends AddressReserve again
// (an identical one is accepted). A sticky error survives it: the driver (580 seen) refuses
// even a fresh primary context of the process with the same error, as native CUDA does
// ("the process must be terminated and relaunched"), so the reset then answers that error
// and so does every later command; only a new session (a new worker process) recovers.
Status CudaBackend::OnDeviceReset(const ir::DeviceResetReq& req, ir::DeviceResetRep*) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  // Allocations are unmapped after the reset: a context with a sticky error may refuse it.
  std::vector<Allocation> allocations;
  std::erase_if(buffers_, [&](const auto& b) {
    if (b.second.device != device) return false;
    allocations.push_back(b.second);
    ranges_.erase(b.second.address);
    return true;
  });
  const auto unpinned = ReleaseDevice(device, true);
  Device& d = devices_[device];
  TANDEM_RETURN_IF_ERROR(drv_->Check(drv_->cuDevicePrimaryCtxReset(d.dev), "cuDevicePrimaryCtxReset"));
  d.sticky = Status::Ok();
  TANDEM_RETURN_IF_ERROR(Enter(device));
  Repin(device, unpinned);
  for (const Allocation& a : allocations) {
    Status st = FreeAllocation(a);
    if (!st.ok()) log::Debug("device {}: freeing the allocation at 0x{:x} after reset: {}", device, a.address, st.message());
  }
  // Whether the reset dropped a reservation is the driver's business: asking for the range
  // again either gets it back at its base, or finds it still held and gives the offer back.
  for (const auto& [base, r] : reservations_) {
    if (r.device != device) continue;
    uint64_t g = 0;
    TANDEM_RETURN_IF_ERROR(Granularity(device, &g));
    CUdeviceptr va = 0;
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemAddressReserve(&va, r.size, g, base, 0), "cuMemAddressReserve"));
    if (va != base) Forget("cuMemAddressFree", device, drv_->cuMemAddressFree(va, r.size));
  }
  return Status::Ok();
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> MakeCudaBackend(const BackendOptions& options) {
  auto driver = cuda::LoadDriver();
  if (!driver.ok()) return driver.status();
  auto devices = cuda::SelectDevices(*driver.value(), options.devices);
  if (!devices.ok()) return devices.status();
  auto output = cuda::OutputCapture::Start();
  if (!output.ok()) return output.status();
  return std::unique_ptr<Backend>(
      std::make_unique<cuda::CudaBackend>(driver.value(), std::move(devices.value()), std::move(output.value())));
}

}  // namespace tandem::server

#else  // built without the CUDA toolkit's headers

namespace tandem::server {

Result<std::unique_ptr<Backend>> MakeCudaBackend(const BackendOptions&) {
  return Status(Code::kUnimplemented, "tandemd was built without the CUDA toolkit headers: no CUDA backend");
}

}  // namespace tandem::server

#endif
