// Buffers: allocation, writes and reads (inline or by RMA through BulkIO), copies, fills
// and rectangular copies. Every offset and size is checked against the buffer first.
#include <fmt/format.h>

#include <array>
#include <cstring>
#include <memory>

#include "opencl_backend.h"
#include "tandem/log.h"

namespace tandem::server::opencl {
namespace {

bool HasRemote(const ir::Region& r) { return r.key != 0 || r.len != 0; }

// The host bytes of a non-blocking write, kept until OpenCL is done with them.
void CL_CALLBACK ReleaseHostBytes(cl_event, cl_int, void* data) {
  delete static_cast<std::shared_ptr<HostBuffer>*>(data);
}

// The bytes a rectangle touches, from OpenCL's formula (pitch 0 = tightly packed):
// the last one is at (o2+r2-1)*slice + (o1+r1-1)*row + o0+r0-1. Overflow-safe.
Status CheckRect(const ir::u64s& origin, const ir::u64s& region, uint64_t row, uint64_t slice, uint64_t size,
                 std::string_view what) {
  if (row == 0) row = region[0];
  if (slice == 0 && __builtin_mul_overflow(region[1], row, &slice))
    return Status::Invalid(fmt::format("{} slice pitch overflows", what));
  uint64_t a, b, c, last;
  const bool overflow = __builtin_add_overflow(origin[2], region[2] - 1, &a) || __builtin_mul_overflow(a, slice, &a) ||
                        __builtin_add_overflow(origin[1], region[1] - 1, &b) || __builtin_mul_overflow(b, row, &b) ||
                        __builtin_add_overflow(origin[0], region[0] - 1, &c) || __builtin_add_overflow(a, b, &last) ||
                        __builtin_add_overflow(last, c, &last);
  if (overflow || last >= size)
    return Status::Invalid(fmt::format("{} rectangle reaches past the end of its buffer of {} bytes", what, size));
  return Status::Ok();
}

}  // namespace

Status OpenCLBackend::OnBufferAlloc(const ir::BufferAllocReq& req, ir::BufferAllocRep*) {
  TANDEM_RETURN_IF_ERROR(CheckNew(buffers_, req.buffer, "buffer"));
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  if (req.size == 0) return Status::Invalid(fmt::format("buffer {:#x} of size 0", req.buffer));
  constexpr uint64_t kKnown = ir::kBufferReadOnly | ir::kBufferWriteOnly | ir::kBufferHostAccessible;
  if (req.flags & ~kKnown) return Status::Invalid(fmt::format("unknown buffer flags {:#x}", req.flags & ~kKnown));
  if ((req.flags & ir::kBufferReadOnly) && (req.flags & ir::kBufferWriteOnly))
    return Status::Invalid("a buffer cannot be both read-only and write-only");
  // Always READ_WRITE: the access flags are the program's promise, which OpenCL does not
  // need to hold it to; `address` places CUDA allocations and means nothing here.
  cl_int err = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(d.value()->context.get(), CL_MEM_READ_WRITE, req.size, nullptr, &err);
  if (err != CL_SUCCESS) return ClError(err, "clCreateBuffer", fmt::format("{} bytes", req.size));
  buffers_[req.buffer] = Buffer{MemRef(mem), static_cast<uint32_t>(req.device), req.size};
  return Status::Ok();
}

Status OpenCLBackend::OnBufferFree(const ir::BufferFreeReq& req, ir::BufferFreeRep*) {
  auto b = Find(buffers_, req.buffer, "buffer");
  if (!b.ok()) return b.status();
  buffers_.erase(req.buffer);  // OpenCL keeps the memory until enqueued commands are done with it
  return Status::Ok();
}

Status OpenCLBackend::OnBufferWrite(const ir::BufferWriteReq& req, ir::BufferWriteRep*) {
  auto b = Find(buffers_, req.buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), req.buffer, req.offset, req.size));
  if (HasRemote(req.remote) && !req.data.empty())
    return Status::Invalid("BufferWrite carries both inline data and a remote region");
  if (!HasRemote(req.remote) && req.data.size() != req.size)
    return Status::Invalid(fmt::format("BufferWrite of {} bytes carries {} bytes of data", req.size, req.data.size()));
  // Through host memory (HostedBulk): the bytes are pulled whole first (before Prepare, which
  // holds events_mu_ until the enqueue), then written without blocking, in queue order, as an
  // inline write's are.
  std::shared_ptr<HostBuffer> pulled = HasRemote(req.remote) ? HostedBulk(req.size) : nullptr;
  if (pulled) {
    TANDEM_RETURN_IF_ERROR(bulk_->Pull(req.remote, req.size, [&](const uint8_t* chunk, size_t off, size_t n) {
      std::memcpy(pulled->data() + off, chunk, n);
      return Status::Ok();
    }));
  }
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, b.value()->device, req.wait, req.signal, &e));
  if (pulled) return WriteKeeping(*b.value(), e, req.offset, std::move(pulled), "a bulk write through host memory", true);
  return HasRemote(req.remote) ? WriteRemote(req, *b.value(), e) : WriteInline(req, *b.value(), e);
}

// Non-blocking, so a write that waits on a user event does not stall the session: `bytes`
// live until the write's event completes. `watched`: until it ends, failed too, as the
// EventWatcher sees it; PoCL 3.1 never calls a CL_COMPLETE callback of a command that failed
// through a user event, which would keep counted bytes (HostedBulk) for good. Any write made
// while a user event or gate is live may fail through it, so it is watched too (and counted
// in watched_writes_); otherwise a completion callback, which costs no poll, frees the bytes.
Status OpenCLBackend::WriteKeeping(Buffer& b, Enqueue& e, uint64_t offset, std::shared_ptr<HostBuffer> bytes,
                                   std::string_view what, bool watched) {
  if (!watched && !EnqueuedCompleteAlone()) {
    watched_writes_->Take(bytes->size());  // no cap: always room
    bytes = HostBytesBudget::Counted(watched_writes_, std::move(bytes));
    watched = true;
  }
  cl_int err = clEnqueueWriteBuffer(e.queue, b.mem.get(), CL_FALSE, offset, bytes->size(), bytes->data(), e.num_wait(),
                                    e.wait_list(), e.event_out(true));
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueWriteBuffer", what);
  if (watched && clRetainEvent(e.done) == CL_SUCCESS) {
    EventWatcher::Get().Watch(e.done, [bytes = std::move(bytes)](cl_int) {});
    Complete(e);
    return Status::Ok();
  }
  auto keep = std::make_unique<std::shared_ptr<HostBuffer>>(std::move(bytes));
  err = clSetEventCallback(e.done, CL_COMPLETE, ReleaseHostBytes, keep.get());
  if (err == CL_SUCCESS) {
    keep.release();  // owned by the callback now
  } else {
    // Without a callback the bytes must outlive the write some other way: wait for it.
    cl_int werr = clWaitForEvents(1, &e.done);
    if (werr != CL_SUCCESS) {
      clReleaseEvent(e.done);
      e.done = nullptr;
      return ClError(werr, "clWaitForEvents", what);
    }
  }
  Complete(e);
  return Status::Ok();
}

Status OpenCLBackend::WriteInline(const ir::BufferWriteReq& req, Buffer& b, Enqueue& e) {
  auto copy = std::make_shared<HeapHostBuffer>(req.size);
  std::memcpy(copy->data(), req.data.data(), req.size);
  return WriteKeeping(b, e, req.offset, std::move(copy), "inline write");
}

Status OpenCLBackend::WriteHostBytes(uint64_t stream, uint64_t buffer, uint64_t offset, const ir::u64s& wait,
                                     uint64_t signal, std::shared_ptr<HostBuffer> bytes) {
  auto b = Find(buffers_, buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), buffer, offset, bytes->size()));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(stream, b.value()->device, wait, signal, &e));
  TANDEM_RETURN_IF_ERROR(WriteKeeping(*b.value(), e, offset, std::move(bytes), "a server-to-server copy's bytes"));
  clFlush(e.queue);
  return Status::Ok();
}

// Whether a bulk transfer must pass through host memory: some command enqueued may wait for a
// user event or another server, so a blocking chunk could wait for what only a later command
// of the session lets go (the program's query before it opens a gate, a callback's). Only on
// the client's channel with deferred replies (a server-to-server transfer's channel lasts for
// its command only, and without deferral the read's wait would run right here anyway). Past
// the budget, or without the memory, the chunked path.
std::shared_ptr<HostBuffer> OpenCLBackend::HostedBulk(uint64_t size) {
  if (!bulk_ || !bulk_is_client() || !deferred_replies_allowed() || EnqueuedCompleteAlone()) return nullptr;
  if (!hosted_bytes_->Take(size)) return nullptr;
  auto bytes = HeapHostBuffer::TryMake(size);
  if (!bytes) {
    hosted_bytes_->Give(size);
    log::Warn("no host memory for a bulk transfer of {} bytes behind a user event; it runs chunk by chunk", size);
    return nullptr;
  }
  return HostBytesBudget::Counted(hosted_bytes_, std::move(bytes));
}

// By RMA, chunk by chunk: each staging chunk is written to the device (blocking) before
// BulkIO reuses it, while the next chunks are already on the wire. The wait list is
// waited for on the host first so no chunk holds its staging memory on a device event.
Status OpenCLBackend::WriteRemote(const ir::BufferWriteReq& req, Buffer& b, Enqueue& e) {
  if (!bulk_) return Status::Invalid("this session has no RMA transport; send the data inline");
  TANDEM_RETURN_IF_ERROR(WaitOnHost(e));
  TANDEM_RETURN_IF_ERROR(bulk_->Pull(req.remote, req.size, [&](const uint8_t* chunk, size_t off, size_t n) {
    cl_int err =
        clEnqueueWriteBuffer(e.queue, b.mem.get(), CL_TRUE, req.offset + off, n, chunk, 0, nullptr, nullptr);
    return err == CL_SUCCESS ? Status::Ok() : ClError(err, "clEnqueueWriteBuffer", fmt::format("chunk at {}", off));
  }));
  return SignalAfter(e);
}

// A chunked transfer's signal is a marker after its last chunk.
Status OpenCLBackend::SignalAfter(Enqueue& e) {
  if (e.signal == 0) return Status::Ok();
  cl_int err = clEnqueueMarkerWithWaitList(e.queue, 0, nullptr, e.event_out());
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueMarkerWithWaitList");
  cl_event held = e.done;  // held_markers_
  if (held && clRetainEvent(held) != CL_SUCCESS) held = nullptr;
  Complete(e);
  if (held) HoldMarker(held);
  return Status::Ok();
}

Status OpenCLBackend::OnBufferRead(const ir::BufferReadReq& req, ir::BufferReadRep* rep) {
  auto b = Find(buffers_, req.buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), req.buffer, req.offset, req.size));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, b.value()->device, req.wait, req.signal, &e));
  if (HasRemote(req.remote)) return ReadRemote(req, *b.value(), e);
  if (req.size > ir::kMaxBytes)
    return Status::Invalid(
        fmt::format("an inline read of {} bytes exceeds {}; give a remote region", req.size, ir::kMaxBytes));
  // Enqueued in order, waited for off the executor: the data travels in the reply, which
  // leaves when the read is done (the reply object outlives the wait). A small read lands in
  // a mapped slot first (ReadSlots: the faster path of NVIDIA's OpenCL), unless the program
  // holds its event: once in a GPU run its profiling query then failed (e2e events_profiling,
  // not reproduced natively), so a read whose event can be inspected stays as it was.
  rep->data.resize(req.size);
  std::shared_ptr<uint8_t> slot =
      req.size <= ReadSlots::kSlotBytes && req.signal == 0 ? ReadSlot(b.value()->device) : nullptr;
  cl_int err = clEnqueueReadBuffer(e.queue, b.value()->mem.get(), CL_FALSE, req.offset, req.size,
                                   slot ? slot.get() : rep->data.data(), e.num_wait(), e.wait_list(),
                                   e.event_out(true));
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueReadBuffer");
  cl_event read = e.done;
  clRetainEvent(read);
  Complete(e);
  clFlush(e.queue);  // even when the wait runs next: see FlushBeforeWait
  return ReplyWhenRead(read, std::move(slot), rep->data.data(), req.size, "read back");
}

Status OpenCLBackend::ReplyWhenRead(cl_event read, std::shared_ptr<uint8_t> slot, uint8_t* out, size_t n,
                                    const char* what, std::shared_ptr<const void> hold) {
  auto done = std::make_shared<EventRef>(read);
  return ReplyLater([done, slot = std::move(slot), out, n, what, hold = std::move(hold)] {
    cl_event ev = done->get();
    cl_int err = clWaitForEvents(1, &ev);
    if (err != CL_SUCCESS) return ClError(err, "clWaitForEvents", what);
    if (slot) std::memcpy(out, slot.get(), n);
    return Status::Ok();
  }, [done] { return Ended(done->get()); });
}

// The device's read slots, made on first use. Without them (mapping failed, logged once)
// reads go straight into the reply.
std::shared_ptr<uint8_t> OpenCLBackend::ReadSlot(uint32_t device) {
  Device& d = devices_[device];
  if (!d.read_slots && !d.read_slots_failed) {
    auto made = ReadSlots::Make(d.context.get(), d.id);
    if (made.ok()) {
      d.read_slots = std::move(made.value());
    } else {
      d.read_slots_failed = true;
      log::Warn("device {}: no mapped memory for small reads ({}); they read into pageable memory",
                device, made.status().ToString());
    }
  }
  return d.read_slots ? d.read_slots->Take() : nullptr;
}

Result<std::shared_ptr<ReadSlots>> ReadSlots::Make(cl_context context, cl_device_id device) {
  auto memory = MappedHostMemory(context, device, kSlotBytes * kSlots, "read slots");
  if (!memory.ok()) return memory.status();
  return std::make_shared<ReadSlots>(std::move(memory.value()));
}

ReadSlots::ReadSlots(std::shared_ptr<HostBuffer> memory) : memory_(std::move(memory)) {
  for (uint32_t i = kSlots; i-- > 0;) free_.push_back(i);
}

uint32_t ReadSlots::available() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(free_.size());
}

std::shared_ptr<uint8_t> ReadSlots::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return nullptr;
  const uint32_t i = free_.back();
  free_.pop_back();
  // The slot holds the pool: a read still in flight at teardown keeps its memory mapped.
  return std::shared_ptr<uint8_t>(memory_->data() + size_t{i} * kSlotBytes, [self = shared_from_this(), i](uint8_t*) {
    std::lock_guard<std::mutex> l(self->mu_);
    self->free_.push_back(i);
  });
}

// By RMA: each chunk is read from the device into a staging chunk, then written to the
// client while the next one is read. Push returns once every write has landed. The wait list
// is waited for on the host first: a blocking read after an event that failed meanwhile
// would never return on PoCL (see Prepare), where clWaitForEvents reports the failure.
Status OpenCLBackend::ReadRemote(const ir::BufferReadReq& req, Buffer& b, Enqueue& e) {
  if (!bulk_) return Status::Invalid("this session has no RMA transport; read inline");
  if (auto bytes = HostedBulk(req.size)) return ReadThroughHost(req, b, e, std::move(bytes));
  TANDEM_RETURN_IF_ERROR(WaitOnHost(e));
  TANDEM_RETURN_IF_ERROR(bulk_->Push(req.remote, req.size, [&](uint8_t* chunk, size_t off, size_t n) {
    cl_int err = clEnqueueReadBuffer(e.queue, b.mem.get(), CL_TRUE, req.offset + off, n, chunk, 0, nullptr, nullptr);
    return err == CL_SUCCESS ? Status::Ok() : ClError(err, "clEnqueueReadBuffer", fmt::format("chunk at {}", off));
  }));
  return SignalAfter(e);
}

// A bulk read while a queue may wait on a user event (HostedBulk): enqueued without blocking,
// in queue order, into host memory; the late reply's wait, off the executor, waits for it and
// then writes the bytes to the client, so the commands after it (the query, the callback that
// opens the gate) go on meanwhile. Behind the read, a marker on a gate of ours that the reply
// sets once the bytes are at the client (or fails, if they never get there) carries the
// command's signal and holds the queue: nothing after it on the queue, and no wait for its
// event, completes before the bytes have landed, as when the chunks ran on the executor; and
// while that gate is open, later bulk transfers pass through host memory too, so their replies
// leave after this one (LateReplies).
Status OpenCLBackend::ReadThroughHost(const ir::BufferReadReq& req, Buffer& b, Enqueue& e,
                                      std::shared_ptr<HostBuffer> bytes) {
  if (req.size > req.remote.len)
    return Status::Invalid(fmt::format("read of {} bytes exceeds the client region of {} bytes", req.size,
                                       req.remote.len));
  auto made = Gate::Make(devices_[e.device].context.get(), open_gates_, events_mu_owner_, "a read's landing gate");
  if (!made.ok()) return made.status();
  std::shared_ptr<Gate> landed = std::move(made.value());
  cl_event read = nullptr;
  cl_int err = clEnqueueReadBuffer(e.queue, b.mem.get(), CL_FALSE, req.offset, req.size, bytes->data(), e.num_wait(),
                                   e.wait_list(), &read);
  if (err != CL_SUCCESS) {
    e.EndFailureCheck();  // Fail takes events_mu_; nothing waits on the gate
    landed->Fail(CL_INVALID_OPERATION);
    return ClError(err, "clEnqueueReadBuffer", "a bulk read through host memory");
  }
  auto done = std::make_shared<EventRef>(read);
  cl_event gate = landed->get();
  err = clEnqueueMarkerWithWaitList(e.queue, 1, &gate, e.event_out(true));
  if (err != CL_SUCCESS) {
    // The read is enqueued: the reply still waits for it, and the bytes still go to the client.
    log::Warn("a bulk read's landing marker: {}", ClError(err, "clEnqueueMarkerWithWaitList").ToString());
    e.done = nullptr;
  }
  cl_event held = e.done;  // held_markers_
  if (held && clRetainEvent(held) != CL_SUCCESS) held = nullptr;
  Complete(e);
  if (held) HoldMarker(held);
  clFlush(e.queue);
  return ReplyLater(
      [done, bytes, landed, bulk = bulk_, remote = req.remote, size = req.size] {
        cl_event ev = done->get();
        cl_int werr = clWaitForEvents(1, &ev);
        Status st = werr == CL_SUCCESS ? Status::Ok() : ClError(werr, "clWaitForEvents", "a bulk read through host memory");
        if (st.ok()) {
          st = bulk->Push(remote, size, [&](uint8_t* chunk, size_t off, size_t n) {
            std::memcpy(chunk, bytes->data() + off, n);
            return Status::Ok();
          });
        }
        if (st.ok()) landed->Open();
        else landed->Fail(FailedStatus(st));
        return st;
      },
      [done] { return Ended(done->get()); });
}

Status OpenCLBackend::OnBufferCopy(const ir::BufferCopyReq& req, ir::BufferCopyRep*) {
  auto src = Find(buffers_, req.src, "buffer");
  if (!src.ok()) return src.status();
  auto dst = Find(buffers_, req.dst, "buffer");
  if (!dst.ok()) return dst.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*src.value(), req.src, req.src_offset, req.size));
  TANDEM_RETURN_IF_ERROR(CheckRange(*dst.value(), req.dst, req.dst_offset, req.size));
  if (src.value()->device != dst.value()->device)
    return Status::Invalid(fmt::format("buffers {:#x} and {:#x} are on different devices; copy through the host",
                                       req.src, req.dst));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, dst.value()->device, req.wait, req.signal, &e));
  cl_int err = clEnqueueCopyBuffer(e.queue, src.value()->mem.get(), dst.value()->mem.get(), req.src_offset,
                                   req.dst_offset, req.size, e.num_wait(), e.wait_list(), e.event_out());
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueCopyBuffer");
  Complete(e);
  return Status::Ok();
}

Status OpenCLBackend::OnBufferFill(const ir::BufferFillReq& req, ir::BufferFillRep*) {
  auto b = Find(buffers_, req.buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), req.buffer, req.offset, req.size));
  const size_t p = req.pattern.size();
  if (p == 0 || p > 128 || (p & (p - 1)) != 0)
    return Status::Invalid(fmt::format("fill pattern of {} bytes (must be 1, 2, 4, ..., 128)", p));
  if (req.size % p != 0 || req.offset % p != 0)
    return Status::Invalid(
        fmt::format("fill offset {} and size {} must be multiples of the {}-byte pattern", req.offset, req.size, p));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, b.value()->device, req.wait, req.signal, &e));
  cl_int err = clEnqueueFillBuffer(e.queue, b.value()->mem.get(), req.pattern.data(), p, req.offset, req.size,
                                   e.num_wait(), e.wait_list(), e.event_out());
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueFillBuffer");
  Complete(e);
  return Status::Ok();
}

Status OpenCLBackend::OnBufferCopyRect(const ir::BufferCopyRectReq& req, ir::BufferCopyRectRep*) {
  auto src = Find(buffers_, req.src, "buffer");
  if (!src.ok()) return src.status();
  auto dst = Find(buffers_, req.dst, "buffer");
  if (!dst.ok()) return dst.status();
  if (req.src_origin.size() != 3 || req.dst_origin.size() != 3 || req.region.size() != 3 || req.pitches.size() != 4)
    return Status::Invalid("BufferCopyRect needs 3 src_origin, 3 dst_origin, 3 region values and 4 pitches");
  for (uint64_t r : req.region)
    if (r == 0) return Status::Invalid("BufferCopyRect region has a zero extent");
  TANDEM_RETURN_IF_ERROR(
      CheckRect(req.src_origin, req.region, req.pitches[0], req.pitches[1], src.value()->size, "source"));
  TANDEM_RETURN_IF_ERROR(
      CheckRect(req.dst_origin, req.region, req.pitches[2], req.pitches[3], dst.value()->size, "destination"));
  if (src.value()->device != dst.value()->device)
    return Status::Invalid(fmt::format("buffers {:#x} and {:#x} are on different devices", req.src, req.dst));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, dst.value()->device, req.wait, req.signal, &e));
  std::array<size_t, 3> so, dor, rg;
  for (size_t i = 0; i < 3; ++i) {
    so[i] = req.src_origin[i];
    dor[i] = req.dst_origin[i];
    rg[i] = req.region[i];
  }
  cl_int err = clEnqueueCopyBufferRect(e.queue, src.value()->mem.get(), dst.value()->mem.get(), so.data(),
                                       dor.data(), rg.data(), req.pitches[0], req.pitches[1], req.pitches[2],
                                       req.pitches[3], e.num_wait(), e.wait_list(), e.event_out());
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueCopyBufferRect");
  Complete(e);
  return Status::Ok();
}

}  // namespace tandem::server::opencl
