// Work that finishes off the executor: reporting completions through a host callback on a
// stream of the backend's own (cross-server event waits), and the asynchronous halves of
// server-to-server copies (ReadToHost, WriteFromHost) through pinned host buffers, which the
// copy engine reads or writes when the stream gets there, not when the copy is enqueued.
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "cuda_backend.h"
#include "tandem/log.h"

namespace tandem::server::cuda {

// Pinned host memory: the backend's own pages (aligned_alloc), registered with the driver
// (cuMemHostRegister, portable) under the context of the device that asked for them, and kept
// for reuse by that device and size class (powers of two from 64 KiB): a block serves only
// the device whose context holds its registration, so resetting one device cannot unpin what
// another device's queued copy uses. The pages never belong to a context: when one goes
// (teardown, a reset) the driver drops its registrations and the blocks count as unpinned
// (Unpin, no driver call); a reset pins its device's blocks again (Repin), so memory held
// across it (the bulk channel's staging, for the whole session) stays valid and fast.
// Nothing is unregistered or freed through the driver, which would wait for the device (a
// stream held by an unset user event never lets go): the pages go with the pool, once the
// backend and every buffer handed out are gone (a buffer's last owner may be a driver
// callback, which must not call CUDA).
struct CudaBackend::PinnedPool {
  struct Block {
    size_t capacity = 0;
    int device = -1;  // whose context pinned it; -1: not pinned now
  };
  std::mutex mu;
  std::multimap<std::pair<int, size_t>, uint8_t*> free;  // by (device, capacity)
  std::map<uint8_t*, Block> all;                         // every block, by address
  // Re-files a free block under its block's current device.
  void Refile(uint8_t* p, int from) {
    const Block& b = all[p];
    auto [lo, hi] = free.equal_range({from, b.capacity});
    for (auto it = lo; it != hi; ++it) {
      if (it->second != p) continue;
      free.erase(it);
      free.emplace(std::make_pair(b.device, b.capacity), p);
      return;
    }
  }
  ~PinnedPool() {
    for (auto& [p, block] : all) std::free(p);
  }
};

namespace {

class PinnedBuffer final : public HostBuffer {
 public:
  PinnedBuffer(std::shared_ptr<CudaBackend::PinnedPool> pool, uint8_t* p, size_t capacity, size_t n)
      : pool_(std::move(pool)), p_(p), capacity_(capacity), size_(n) {}
  ~PinnedBuffer() override {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->free.emplace(std::make_pair(pool_->all[p_].device, capacity_), p_);
  }
  uint8_t* data() override { return p_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<CudaBackend::PinnedPool> pool_;
  uint8_t* p_;
  size_t capacity_, size_;
};

size_t SizeClass(size_t n) {
  size_t c = 64u << 10;
  while (c < n) c <<= 1;
  return c;
}

void CUDA_CB RunCallback(CUstream, CUresult status, void* data) {
  std::unique_ptr<std::function<void(int32_t)>> fn(static_cast<std::function<void(int32_t)>*>(data));
  (*fn)(status == CUDA_SUCCESS ? ir::kEventComplete : -static_cast<int32_t>(status));
}

}  // namespace

Result<std::shared_ptr<HostBuffer>> CudaBackend::Pinned(uint32_t device, size_t n) {
  if (!pinned_) pinned_ = std::make_shared<PinnedPool>();
  const size_t capacity = SizeClass(n);
  uint8_t* p = nullptr;
  bool pinned = false;
  {
    std::lock_guard<std::mutex> lock(pinned_->mu);
    // One this device pinned, else one nobody holds pinned now.
    for (int owner : {static_cast<int>(device), -1}) {
      if (auto it = pinned_->free.find({owner, capacity}); it != pinned_->free.end()) {
        p = it->second;
        pinned_->free.erase(it);
        pinned = owner >= 0;
        break;
      }
    }
  }
  if (!p) {
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, capacity));
    if (!p) return Status(Code::kOutOfMemory, fmt::format("no host memory for {} bytes of pinned staging", capacity));
    std::lock_guard<std::mutex> lock(pinned_->mu);
    pinned_->all[p] = PinnedPool::Block{capacity, -1};
  }
  if (!pinned) {
    Status st = Pin(device, p, capacity);
    std::lock_guard<std::mutex> lock(pinned_->mu);
    if (!st.ok()) {
      pinned_->free.emplace(std::make_pair(-1, capacity), p);
      return st;
    }
    pinned_->all[p].device = static_cast<int>(device);
  }
  return std::shared_ptr<HostBuffer>(std::make_shared<PinnedBuffer>(pinned_, p, capacity, n));
}

// Registers the block under the device's context, leaving current whatever context was. A
// registration the driver still holds (a context released but kept alive by another holder
// of the primary context) is as good as a new one.
Status CudaBackend::Pin(uint32_t device, uint8_t* p, size_t n) {
  CUcontext before = nullptr;
  TANDEM_RETURN_IF_ERROR(drv_->Check(drv_->cuCtxGetCurrent(&before), "cuCtxGetCurrent"));
  TANDEM_RETURN_IF_ERROR(Enter(device));
  CUresult r = drv_->cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
  Status st = r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? Status::Ok() : Check(device, r, "cuMemHostRegister");
  if (before != devices_[device].ctx) {
    Status back = drv_->Check(drv_->cuCtxSetCurrent(before), "cuCtxSetCurrent");
    if (st.ok()) st = back;
  }
  return st;
}

// The device's context is gone (released or reset): the blocks it pinned are not pinned any
// more, in use or not, and stay this process's memory. Returns them.
std::vector<uint8_t*> CudaBackend::Unpin(uint32_t device) {
  std::vector<uint8_t*> unpinned;
  if (!pinned_) return unpinned;
  std::lock_guard<std::mutex> lock(pinned_->mu);
  for (auto& [p, block] : pinned_->all) {
    if (block.device != static_cast<int>(device)) continue;
    block.device = -1;
    pinned_->Refile(p, static_cast<int>(device));
    unpinned.push_back(p);
  }
  return unpinned;
}

// After a reset, the blocks the device had pinned are pinned again under its new context, so
// memory held across the reset (the bulk staging) is as fast as before. A failure leaves the
// block unpinned: it still works, through the staging slots.
void CudaBackend::Repin(uint32_t device, const std::vector<uint8_t*>& blocks) {
  for (uint8_t* p : blocks) {
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(pinned_->mu);
      capacity = pinned_->all[p].capacity;
    }
    Status st = Pin(device, p, capacity);
    std::lock_guard<std::mutex> lock(pinned_->mu);
    if (!st.ok()) {
      log::Debug("device {}: pinning {} bytes again after the reset: {}", device, capacity, st.message());
      continue;
    }
    pinned_->all[p].device = static_cast<int>(device);
    pinned_->Refile(p, -1);
  }
}

bool CudaBackend::IsPinned(const void* p, size_t n) const {
  if (!pinned_) return false;
  const auto* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(pinned_->mu);
  auto it = pinned_->all.upper_bound(const_cast<uint8_t*>(b));
  if (it == pinned_->all.begin()) return false;
  --it;
  const auto& [base, block] = *it;
  return block.device >= 0 && n <= block.capacity && static_cast<size_t>(b - base) <= block.capacity - n;
}

// Pinned under the first device the session uses (device 0 if none yet), so a session on
// device 1 alone does not create device 0's context for it.
Result<std::shared_ptr<HostBuffer>> CudaBackend::BulkStaging(size_t n) {
  if (devices_.empty()) return Status(Code::kUnimplemented, "no device");
  uint32_t device = 0;
  while (device + 1 < devices_.size() && !devices_[device].ctx) ++device;
  if (!devices_[device].ctx) device = 0;
  return Pinned(device, n);
}

// The device's notify stream waits for `event` (as cudaStreamWaitEvent would) or, with no
// event, for the work `q` has so far; then fn runs on a driver thread with the status.
Status CudaBackend::CallWhenDone(const Queue& q, std::optional<uint64_t> event, std::function<void(int32_t)> fn) {
  Device& d = devices_[q.device];
  if (!d.notify_stream)
    TANDEM_RETURN_IF_ERROR(Check(q.device, drv_->cuStreamCreateWithPriority(&d.notify_stream, CU_STREAM_NON_BLOCKING, 0),
                                 "cuStreamCreateWithPriority"));
  const Queue notify{q.device, d.notify_stream};
  if (event) {
    TANDEM_RETURN_IF_ERROR(WaitEvents(notify, {*event}));
  } else {
    CUevent mark = nullptr;
    TANDEM_RETURN_IF_ERROR(Check(q.device, drv_->cuEventCreate(&mark, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    Status st = Check(q.device, drv_->cuEventRecord(mark, q.stream), "cuEventRecord");
    if (st.ok()) st = Check(q.device, drv_->cuStreamWaitEvent(notify.stream, mark, 0), "cuStreamWaitEvent");
    Forget("cuEventDestroy", q.device, drv_->cuEventDestroy(mark));  // freed once it has completed
    TANDEM_RETURN_IF_ERROR(st);
  }
  auto held = std::make_unique<std::function<void(int32_t)>>(std::move(fn));
  TANDEM_RETURN_IF_ERROR(
      Check(q.device, drv_->cuStreamAddCallback(notify.stream, RunCallback, held.get(), 0), "cuStreamAddCallback"));
  held.release();  // RunCallback owns it now
  return Status::Ok();
}

// Cross-server event waits: the exported event's completion, reported without blocking, and
// also after a device error (cuStreamAddCallback runs then; cuLaunchHostFunc would not).
Status CudaBackend::NotifyWhenDone(uint64_t event, std::function<void(int32_t status)> done) {
  auto device = EventDevice(event, "EventExport");
  if (!device.ok()) return device.status();
  TANDEM_RETURN_IF_ERROR(Enter(device.value()));
  return CallWhenDone(Queue{device.value(), nullptr}, event, std::move(done));
}

// What both halves start with: the device memory, its stream (after `wait`; the signal checked
// first, so that a bad one fails the command before anything is enqueued), and a pinned
// buffer for the bytes.
Result<CudaBackend::PeerStart> CudaBackend::StartPeer(uint64_t stream, uint64_t buffer, uint64_t offset,
                                                      uint64_t size, const ir::u64s& wait, uint64_t signal,
                                                      const char* what) {
  auto span = Resolve(buffer, offset, size, what);
  if (!span.ok()) return span.status();
  auto q = ResolveStream(stream, span->device);
  if (!q.ok()) return q.status();
  if (q->device != span->device)
    return Status::Invalid(
        fmt::format("{}: stream {} is on device {}, the memory on device {}", what, stream, q->device, span->device));
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, wait, signal));
  auto host = Pinned(q->device, size);
  if (!host.ok()) return host.status();
  return PeerStart{span->address, q.value(), std::move(host).value()};
}

// Out of the pool for the process's life, from any thread (a failed restore's release runs on
// whichever thread saw the transfer end): a driver failure path only.
void CudaBackend::Keep(uint32_t device, std::shared_ptr<HostBuffer> host) {
  log::Warn("device {}: a pinned staging block of {} bytes is kept out of use (a copy may still use it)", device,
            host->size());
  struct Kept {
    std::mutex mu;
    std::vector<std::shared_ptr<HostBuffer>> blocks;
  };
  static auto* kept = new Kept;  // never destroyed: a driver thread may still add at exit
  std::lock_guard<std::mutex> lock(kept->mu);
  kept->blocks.push_back(std::move(host));
}

Status CudaBackend::ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                               uint64_t signal, std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) {
  auto p = StartPeer(stream, buffer, offset, size, wait, signal, "PeerSend");
  if (!p.ok()) return p.status();
  const Queue* q = &p->queue;
  TANDEM_RETURN_IF_ERROR(
      Check(q->device, drv_->cuMemcpyDtoHAsync(p->host->data(), p->address, size, q->stream), "cuMemcpyDtoHAsync"));
  Status st = Signal(*q, signal);
  if (st.ok())
    st = CallWhenDone(*q, std::nullopt, [bytes = p->host, done = std::move(done)](int32_t status) {
      if (status != ir::kEventComplete)
        done(Status(Code::kApiError, fmt::format("the copy of a server-to-server transfer's source failed ({})", -status),
                    -status, Api::kCuda));
      else
        done(bytes);
    });
  // The copy into the block is enqueued and cannot be taken back.
  if (!st.ok()) Keep(q->device, p->host);
  return st;
}

namespace {

void CUDA_CB SetFlag(CUstream, CUresult, void* flag) {
  __atomic_store_n(static_cast<uint32_t*>(flag), 1u, __ATOMIC_RELEASE);
}

}  // namespace

// The write is enqueued now, held on a flag until the bytes are in the staging (release).
// A transfer that fails cannot take the enqueued write back: its release first copies the
// destination's own bytes into the staging, on a stream of its own behind an event recorded
// where the stream stood before the write, and only then sets the flag, so the write puts back
// what was there. Its own stream: two failed receives whose streams wait on each other (one's
// `before` behind the other's flag) would deadlock on a shared one. Release runs on whichever
// thread saw the transfer end.
Result<PendingWrite> CudaBackend::WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                                const ir::u64s& wait, uint64_t signal) {
  auto p = StartPeer(stream, buffer, offset, size, wait, signal, "PeerRecv");
  if (!p.ok()) return p.status();
  const Queue q = p->queue;
  Device& d = devices_[q.device];
  auto word = NewUserFlag(q.device);
  if (!word.ok()) return word.status();
  uint32_t* flag = word.value();
  CUevent before = nullptr;
  TANDEM_RETURN_IF_ERROR(Check(q.device, drv_->cuEventCreate(&before, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  Status st = Check(q.device, drv_->cuEventRecord(before, q.stream), "cuEventRecord");
  if (st.ok()) st = WaitUserFlag(q, flag);
  if (!st.ok()) {
    Forget("cuEventDestroy", q.device, drv_->cuEventDestroy(before));
    return st;
  }
  // From here the stream is held on the flag: a failure lets it go, after the write (if it was
  // enqueued) has run from a block nobody else has.
  st = Check(q.device, drv_->cuMemcpyHtoDAsync(p->address, p->host->data(), size, q.stream), "cuMemcpyHtoDAsync");
  const bool write_enqueued = st.ok();
  if (st.ok()) st = Signal(q, signal);
  // The buffer stays until the write has read it.
  if (st.ok()) st = CallWhenDone(q, std::nullopt, [keep = p->host](int32_t) {});
  if (!st.ok()) {
    Forget("cuEventDestroy", q.device, drv_->cuEventDestroy(before));
    SetFlag(nullptr, CUDA_SUCCESS, flag);
    if (write_enqueued) Keep(q.device, p->host);
    return st;
  }
  PendingWrite pending;
  pending.staging = p->host;
  pending.release = [drv = drv_, ctx = d.ctx, before, flag, dst = p->address, staging = p->host, size,
                     device = q.device](const Status& got) {
    // Any thread: the context made current here is the device's, as for the executor.
    CUresult r = drv->cuCtxSetCurrent(ctx);
    if (!got.ok()) {
      CUstream restore = nullptr;
      bool copying = false;  // the restore's copy into the staging is enqueued
      if (r == CUDA_SUCCESS) r = drv->cuStreamCreateWithPriority(&restore, CU_STREAM_NON_BLOCKING, 0);
      if (r == CUDA_SUCCESS) r = drv->cuStreamWaitEvent(restore, before, 0);
      if (r == CUDA_SUCCESS) copying = (r = drv->cuMemcpyDtoHAsync(staging->data(), dst, size, restore)) == CUDA_SUCCESS;
      if (r == CUDA_SUCCESS) r = drv->cuStreamAddCallback(restore, SetFlag, flag, 0);
      if (r != CUDA_SUCCESS) {
        log::Warn("device {}: a failed server-to-server receive could not keep its destination's bytes ({}): "
                  "{} bytes there are undefined",
                  device, drv->Check(r, "restore").message(), size);
        SetFlag(nullptr, CUDA_SUCCESS, flag);
        // A copy may still write into the block when the write has read it: never reused.
        if (copying) Keep(device, staging);
      }
      if (restore) drv->cuStreamDestroy(restore);  // returns at once; its work still runs
    } else {
      SetFlag(nullptr, CUDA_SUCCESS, flag);
      if (r != CUDA_SUCCESS)
        log::Warn("device {}: releasing a server-to-server receive: {}", device, drv->Check(r, "cuCtxSetCurrent").message());
    }
    drv->cuEventDestroy(before);  // freed once it has completed
  };
  return pending;
}

}  // namespace tandem::server::cuda
