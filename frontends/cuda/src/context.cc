// Devices as the program sees them: connecting to the Tandem servers on first use, the
// pointer-stable address range of each device, loading modules and resolving functions and
// symbols once per device, and collecting asynchronous errors at sync points.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "frontend.h"

namespace tandem::cuda {

Frontend& Frontend::Get() {
  // Never destroyed: __cudaUnregisterFatBinary runs from atexit after static destructors.
  static Frontend* f = new Frontend();
  return *f;
}

int& CurrentIndex() {
  thread_local int index = 0;
  return index;
}

// What the GPU can do and a program through Tandem cannot: host memory mapped into kernels,
// managed memory, memory pools (cudaMallocAsync), atomics with the host. Reported as 0, so
// that a program that asks first takes its other path; the calls themselves answer
// cudaErrorNotSupported.
bool RemoteLacks(int attr) {
  switch (attr) {
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrManagedMemory:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrDirectManagedMemAccessFromHost:
    case cudaDevAttrPageableMemoryAccess:
    case cudaDevAttrPageableMemoryAccessUsesHostPageTables:
    case cudaDevAttrCanUseHostPointerForRegisteredMem:
    case cudaDevAttrHostNativeAtomicSupported:
    case cudaDevAttrMemoryPoolsSupported:
      return true;
    default:
      return false;
  }
}

int32_t DeviceContext::Attr(int attr, int32_t fallback) const {
  if (RemoteLacks(attr)) return 0;
  int32_t v = fallback;
  dev->PropAs<int32_t>(ir::kCudaAttrBase + static_cast<uint32_t>(attr), &v);
  return v;
}

std::vector<uint64_t> DeviceContext::ForeignWaits(uint64_t stream, const client::Session* source) const {
  std::vector<uint64_t> out;
  if (auto it = foreign_waits.find(stream); it != foreign_waits.end())
    for (const auto& [session, event] : it->second)
      if (session == source) out.push_back(event);
  return out;
}

const DeviceContext::LaunchLimits& DeviceContext::Limits() const {
  if (!launch_limits) {
    launch_limits = LaunchLimits{
        .threads = static_cast<uint64_t>(Attr(cudaDevAttrMaxThreadsPerBlock, 1024)),
        .block = {static_cast<unsigned>(Attr(cudaDevAttrMaxBlockDimX, 1024)),
                  static_cast<unsigned>(Attr(cudaDevAttrMaxBlockDimY, 1024)),
                  static_cast<unsigned>(Attr(cudaDevAttrMaxBlockDimZ, 64))},
        .grid = {static_cast<unsigned>(Attr(cudaDevAttrMaxGridDimX, 0x7fffffff)),
                 static_cast<unsigned>(Attr(cudaDevAttrMaxGridDimY, 65535)),
                 static_cast<unsigned>(Attr(cudaDevAttrMaxGridDimZ, 65535))},
        .shared = static_cast<size_t>(Attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 << 10))};
  }
  return *launch_limits;
}

int32_t Function::Attr(uint32_t cu_attr, int32_t fallback) const {
  for (const ir::Prop& p : info.attrs) {
    if (p.key != ir::kCudaFuncAttrBase + cu_attr || p.value.size() != sizeof(int32_t)) continue;
    int32_t v;
    std::memcpy(&v, p.value.data(), sizeof v);
    return v;
  }
  return fallback;
}

cudaError_t Frontend::Connect() {
  if (connected_) return connect_error_;
  connected_ = true;
  client::Runtime& rt = client::Runtime::Get();
  if (!rt.status().ok()) {
    log::Error("no CUDA device: {}", rt.status().message());
    return connect_error_ = cudaErrorNoDevice;
  }
  std::vector<client::Device*> list = rt.Devices(Api::kCuda);
  if (list.empty()) {
    log::Error("no CUDA device: the servers of TANDEM_SERVERS offer none (is tandemd running with --backend cuda?)");
    return connect_error_ = cudaErrorNoDevice;
  }
  for (client::Device* dev : list) {
    auto d = std::make_unique<DeviceContext>();
    d->index = static_cast<int>(device_list_.size());
    d->dev = dev;
    device_list_.push_back(d.get());
    devices_.push_back(std::move(d));
  }
  // Registered after the runtime's own exit hook, so it runs first: from here on the
  // sessions are closing and unregistration must not talk to them.
  std::atexit([] { Frontend::Get().exiting = true; });
  return cudaSuccess;
}

cudaError_t Frontend::Devices(std::vector<DeviceContext*>** out) {
  cudaError_t e = Connect();
  *out = &device_list_;
  return e;
}

DeviceContext* Frontend::Existing(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= device_list_.size()) return nullptr;
  DeviceContext* d = device_list_[static_cast<size_t>(index)];
  return d->ready ? d : nullptr;
}

cudaError_t Frontend::Device(int index, DeviceContext** out) {
  TANDEM_RETURN_CUDA_IF_ERROR(Connect());
  if (index < 0 || static_cast<size_t>(index) >= device_list_.size()) return cudaErrorInvalidDevice;
  DeviceContext& d = *device_list_[static_cast<size_t>(index)];
  if (!d.ready && d.unusable == cudaSuccess) d.unusable = SetUp(d);
  if (d.unusable != cudaSuccess) return d.unusable;
  *out = &d;
  return cudaSuccess;
}

cudaError_t Frontend::Current(DeviceContext** out) { return Device(CurrentIndex(), out); }

// Reserves the device's address range on the client (so no host mapping can ever alias a
// device pointer) and on the server (so allocations land at the addresses we choose).
cudaError_t Frontend::SetUp(DeviceContext& d) {
  d.va_base = ir::kCudaVaBase + static_cast<uint64_t>(d.index) * ir::kCudaVaPerDevice;
  d.va_size = ir::kCudaVaPerDevice;
  void* want = reinterpret_cast<void*>(d.va_base);
  void* got = mmap(want, d.va_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                   -1, 0);
  if (got != want) {
    if (got != MAP_FAILED) munmap(got, d.va_size);
    log::Error("CUDA device {} is unusable: the client cannot reserve its address range [{:#x}, {:#x}) "
               "(already mapped in this process)", d.index, d.va_base, d.va_base + d.va_size);
    return cudaErrorDevicesUnavailable;
  }
  auto rep = d.session().Call(ir::AddressReserveReq{.device = d.remote(), .base = d.va_base, .size = d.va_size});
  if (!rep.ok()) {
    munmap(want, d.va_size);
    log::Error("CUDA device {} ({} on {}) is unusable: the server cannot map device memory at [{:#x}, {:#x}): {}",
               d.index, d.dev->info.name, d.session().server(), d.va_base, d.va_base + d.va_size,
               rep.status().message());
    return cudaErrorDevicesUnavailable;
  }
  d.granularity = rep->granularity ? rep->granularity : (2u << 20);
  d.va = std::make_unique<RangeAllocator>(d.va_base, d.va_size);
  d.ready = true;
  return cudaSuccess;
}

// One ModuleLoad per image content per device; the image travels as nvcc embedded it and
// the server's driver picks the SASS or JITs the PTX.
static cudaError_t EnsureModule(DeviceContext& d, FatBinary& fb, uint64_t* module,
                                std::shared_ptr<Status>* load_status) {
  if (!fb.valid) return cudaErrorInvalidKernelImage;
  if (!fb.hashed) {
    fb.hash = XXH3_128bits(fb.image, fb.size);
    fb.hashed = true;
  }
  const std::pair<uint64_t, uint64_t> key{fb.hash.high64, fb.hash.low64};
  if (auto it = d.modules.find(key); it != d.modules.end()) {
    *module = it->second;
    return cudaSuccess;
  }
  *module = client::Runtime::Get().NewHandle();
  const auto* bytes = static_cast<const uint8_t*>(fb.image);
  auto status = std::make_shared<Status>();
  // Answered before the FunctionGet/ModuleGlobal that follows it, which waits for its reply.
  d.session().Post(ir::ModuleLoadReq{.module = *module,
                                     .device = d.remote(),
                                     .kind = static_cast<uint32_t>(ir::ModuleKind::kCudaImage),
                                     .image = ir::bytes(bytes, bytes + fb.size)},
                   [status](const Status& st, ir::ModuleLoadRep&&) { *status = st; });
  d.modules.emplace(key, *module);
  *load_status = status;
  return cudaSuccess;
}

// A failed load is forgotten so that a later use tries again and reports it again.
static cudaError_t CheckLoad(DeviceContext& d, const FatBinary& fb, const std::shared_ptr<Status>& load) {
  if (!load || load->ok()) return cudaSuccess;
  log::Error("device {}: loading the module failed: {}", d.index, load->message());
  d.modules.erase({fb.hash.high64, fb.hash.low64});
  return ToCuda(*load);
}

cudaError_t EnsureFunction(DeviceContext& d, const Kernel& k, const Function** out) {
  if (auto it = d.functions.find(&k); it != d.functions.end()) {
    *out = &it->second;
    return cudaSuccess;
  }
  uint64_t module = 0;
  std::shared_ptr<Status> load;
  TANDEM_RETURN_CUDA_IF_ERROR(EnsureModule(d, *k.fatbin, &module, &load));
  Function fn;
  fn.handle = client::Runtime::Get().NewHandle();
  auto rep = d.session().Call(ir::FunctionGetReq{.function = fn.handle, .module = module, .name = k.name});
  TANDEM_RETURN_CUDA_IF_ERROR(CheckLoad(d, *k.fatbin, load));
  if (!rep.ok()) {
    log::Error("device {}: kernel {}: {}", d.index, k.name, rep.status().message());
    return ToCuda(rep.status());
  }
  fn.info = std::move(rep->info);
  // Attributes the program set before this device first saw the kernel.
  for (const auto& [attr, value] : k.attrs) {
    d.session().Post(ir::FunctionSetAttrReq{.function = fn.handle, .attr = attr, .value = value});
    SetFunctionAttr(fn, attr, value);
  }
  if (k.cache_config) d.session().Post(ir::FunctionSetCacheConfigReq{.function = fn.handle, .config = *k.cache_config});
  *out = &d.functions.emplace(&k, std::move(fn)).first->second;
  return cudaSuccess;
}

void SetFunctionAttr(Function& fn, uint32_t cu_attr, int32_t value) {
  ir::bytes bytes(sizeof value);
  std::memcpy(bytes.data(), &value, sizeof value);
  for (ir::Prop& p : fn.info.attrs) {
    if (p.key == ir::kCudaFuncAttrBase + cu_attr) {
      p.value = bytes;
      return;
    }
  }
  fn.info.attrs.push_back(ir::Prop{ir::kCudaFuncAttrBase + cu_attr, bytes});
}

cudaError_t EnsureSymbol(DeviceContext& d, const Symbol& s, uint64_t* address, uint64_t* size) {
  if (auto it = d.globals.find(&s); it != d.globals.end()) {
    *address = it->second.first;
    *size = it->second.second;
    return cudaSuccess;
  }
  uint64_t module = 0;
  std::shared_ptr<Status> load;
  TANDEM_RETURN_CUDA_IF_ERROR(EnsureModule(d, *s.fatbin, &module, &load));
  auto rep = d.session().Call(ir::ModuleGlobalReq{.module = module, .name = s.name});
  TANDEM_RETURN_CUDA_IF_ERROR(CheckLoad(d, *s.fatbin, load));
  if (!rep.ok()) {
    log::Error("device {}: symbol {}: {}", d.index, s.name, rep.status().message());
    return rep.status().code() == Code::kApiError ? ToCuda(rep.status()) : cudaErrorInvalidSymbol;
  }
  d.globals.emplace(&s, std::make_pair(rep->address, rep->size));
  *address = rep->address;
  *size = rep->size;
  return cudaSuccess;
}

void ForgetFatBinary(const FatBinary* fb) {
  Frontend& f = Frontend::Get();
  if (!fb->hashed) return;  // never loaded anywhere
  const std::pair<uint64_t, uint64_t> key{fb->hash.high64, fb->hash.low64};
  // Modules are shared by content: another registered image with the same bytes (the same
  // object linked into two libraries) keeps the module alive.
  const bool shared = std::any_of(f.fatbins.begin(), f.fatbins.end(), [&](const auto& other) {
    return other.get() != fb && other->hashed && other->hash.high64 == key.first && other->hash.low64 == key.second;
  });
  for (DeviceContext* d : f.known()) {
    const bool tell_server = !f.exiting && d->session().health().ok();
    std::erase_if(d->functions, [&](const auto& e) {
      if (e.first->fatbin != fb) return false;
      if (tell_server) d->session().Post(ir::FunctionFreeReq{.function = e.second.handle});
      return true;
    });
    std::erase_if(d->globals, [&](const auto& e) { return e.first->fatbin == fb; });
    if (shared) continue;
    auto m = d->modules.find(key);
    if (m == d->modules.end()) continue;
    if (tell_server) {
      // The driver's unload may wait for the module's work, which a host callback's gate may hold.
      std::unique_lock<std::mutex> order = f.AfterCallbacks();
      d->session().Post(ir::ModuleFreeReq{.module = m->second});
    }
    d->modules.erase(m);
  }
}

cudaError_t TakeAsyncErrors(DeviceContext& d) {
  cudaError_t first = cudaSuccess;
  Status health = d.session().health();
  std::vector<ir::AsyncError> errors = d.session().TakeAsyncErrors();
  if (!health.ok()) {
    log::Error("device {}: server {} is gone: {}", d.index, d.session().server(), health.message());
    first = cudaErrorDevicesUnavailable;
  }
  cudaError_t sticky = cudaSuccess;
  for (const ir::AsyncError& e : errors) {
    Status st(static_cast<Code>(e.code), e.message, e.native, static_cast<Api>(e.api));
    cudaError_t ce = ToCuda(st);
    log::Info("device {}: asynchronous error of {}: {}", d.index, ir::CommandName(static_cast<uint16_t>(e.opcode)),
              st.ToString());
    if (first == cudaSuccess) first = ce;
    if (sticky == cudaSuccess && IsSticky(ce)) sticky = ce;
  }
  // A sticky error among them, not only a first one, corrupts the context: it is what this
  // and every later call report, as natively.
  if (sticky != cudaSuccess) first = sticky;
  if (IsSticky(first)) {
    std::lock_guard<std::mutex> lock(Frontend::Get().mu);
    d.sticky = first;
  }
  return first;
}

uint64_t Frontend::BeginPending(uint64_t stream) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_.emplace(++last_ticket_, stream);
  return last_ticket_;
}

void Frontend::EndPending(uint64_t ticket, const Status& st) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  if (!st.ok() && pending_error_.ok()) pending_error_ = st;
  pending_.erase(ticket);
  pending_cv_.notify_all();
}

uint64_t Frontend::LastPendingTicket() {
  std::lock_guard<std::mutex> lock(pending_mu_);
  return last_ticket_;
}

void Frontend::WaitPendingThrough(uint64_t ticket, uint64_t stream) {
  std::unique_lock<std::mutex> lock(pending_mu_);
  auto ordered_after = [&](uint64_t copy_stream) {
    if (copy_stream == stream) return true;
    if (stream == 0) return !non_blocking_.contains(copy_stream);  // the legacy stream waits for blocking streams
    return copy_stream == 0 && !non_blocking_.contains(stream);   // a blocking stream waits for the legacy one
  };
  pending_cv_.wait(lock, [&] {
    for (const auto& [t, s] : pending_) {
      if (t > ticket) return true;
      if (ordered_after(s)) return false;
    }
    return true;
  });
}

void Frontend::NoteStream(uint64_t stream, bool non_blocking) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  if (non_blocking) non_blocking_.insert(stream);
}

void Frontend::ForgetStream(uint64_t stream) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  non_blocking_.erase(stream);  // a copy of it still pending is then waited for as a blocking one's
}

cudaError_t Frontend::WaitPending() {
  std::unique_lock<std::mutex> lock(pending_mu_);
  pending_cv_.wait(lock, [&] { return pending_.empty(); });
  Status st = pending_error_;
  pending_error_ = Status::Ok();
  return ToCuda(st);
}

void Frontend::BeginCallback() {
  std::lock_guard<std::mutex> lock(pending_mu_);
  ++callbacks_;
}

void Frontend::EndCallback() {
  std::lock_guard<std::mutex> lock(pending_mu_);
  if (--callbacks_ == 0) pending_cv_.notify_all();
}

void Frontend::WaitCallbacks() {
  std::unique_lock<std::mutex> lock(pending_mu_);
  pending_cv_.wait(lock, [&] { return callbacks_ == 0; });
}

void Frontend::CallbackGapForTests() {
  static const long gap_us = [] {
    const char* v = std::getenv("TANDEM_TEST_CALLBACK_GAP_US");
    return v ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
}

}  // namespace tandem::cuda
