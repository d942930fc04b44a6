// Everything enqueued on a command queue: buffer reads/writes (plain and rectangular),
// copies, fills, map/unmap, kernel launches, markers and barriers. Commands are posted on
// the queue's stream and batched; only blocking reads and maps wait, and read events
// complete when the data has reached host memory (the reply callback).
#include <algorithm>
#include <array>
#include <cstdlib>

#include "objects.h"

namespace tandem::ocl {

cl_int Finish(cl_command_queue q);  // context_queue.cc: clFinish

namespace {

using Completion = _cl_event::Completion;

// What every enqueue shares: the checked queue, the wait list as remote handles and, when
// the application asked for one, the event the command signals.
struct Command {
  cl_command_queue q = nullptr;
  std::vector<uint64_t> wait;
  cl_event event = nullptr;
  std::vector<cl_event> foreign;  // wait-list events of other servers (held by the caller)
  cl_command_type type = 0;
  Completion completion = Completion::kRemote;
  uint64_t signal() const { return event ? event->handle : 0; }
};

cl_int Begin(cl_command_queue q, cl_uint n, const cl_event* list, cl_event* out, cl_command_type type,
             Completion completion, Command* cmd) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  cmd->q = q;
  cmd->type = type;
  cmd->completion = completion;
  if (cl_int err = CheckWaitList(q, n, list, &cmd->wait, &cmd->foreign); err != CL_SUCCESS) return err;
  if (out) cmd->event = NewEvent(q->context, q, type, completion);
  return CL_SUCCESS;
}

// Hands the event to the application on success (an event the application did not ask for
// is Tandem's: buffers it wrote hold it); drops it otherwise.
cl_int End(Command& cmd, cl_event* out, cl_int err) {
  if (!cmd.event) return err;
  if (err == CL_SUCCESS) {
    cmd.event->bound = true;
    if (out) {
      *out = cmd.event;
      return err;
    }
  }
  cmd.event->Release();
  return err;
}

// Checks a buffer the command uses (AcquireBuffer orders the command after its upload).
cl_int CheckMem(Command& cmd, cl_mem mem) {
  if (!Valid(mem)) return CL_INVALID_MEM_OBJECT;
  if (mem->context != cmd.q->context) return CL_INVALID_CONTEXT;
  return CL_SUCCESS;
}

// Whether [offset, offset+size) of `mem` is all of its root buffer.
bool WholeRoot(cl_mem mem, size_t offset, size_t size) {
  return !mem->parent && offset == 0 && size == mem->size;
}

// The buffer's handle on the command's server, its bytes made current there. A command that
// writes a buffer of a context over several servers signals an event, its own if the program
// asked for none, so a later copy out of that server can wait for exactly this write. A
// writing use changes [offset, offset+size) of `mem` (all of it by default: a kernel's).
cl_int Acquire(Command& cmd, cl_mem mem, BufferUse use, uint64_t* handle, size_t offset = 0,
               size_t size = SIZE_MAX) {
  if (use != BufferUse::kRead && !cmd.event && SpansServers(cmd.q->context)) {
    cmd.event = NewEvent(cmd.q->context, cmd.q, cmd.type, cmd.completion);
    cmd.event->internal = true;
  }
  const size_t at = std::min(offset, mem->size);
  const uint64_t lo = mem->origin + at;
  return AcquireBuffer(cmd.q, mem, use, handle, &cmd.wait, cmd.foreign, cmd.event, lo,
                       lo + std::min(size, mem->size - at));
}

cl_int CheckRange(cl_mem mem, size_t offset, size_t size) {
  if (size == 0 || offset > mem->size || size > mem->size - offset) return CL_INVALID_VALUE;
  return CL_SUCCESS;
}

// The host side of a read: counted on the queue for clFinish, completed exactly once
// (by the reply callback, or on the caller's thread when blocking or when posting fails).
class HostOp {
 public:
  HostOp(cl_command_queue q, cl_event e) : q_(q), e_(e) {
    std::lock_guard lock(q->mu);
    id_ = q->host_next++;
    q->host_open.insert(id_);
  }
  void Complete(const Status& st, std::string_view call) {
    if (done_.exchange(true)) return;
    if (e_) SetEventStatus(e_.get(), st.ok() ? CL_COMPLETE : ToCl(st, call, CL_INVALID_MEM_OBJECT));
    std::lock_guard lock(q_->mu);
    q_->host_open.erase(id_);
    q_->cv.notify_all();
  }

 private:
  Held<_cl_command_queue> q_;
  Held<_cl_event> e_;
  uint64_t id_ = 0;
  std::atomic<bool> done_{false};
};

// Reads [offset, offset+size) of mem into dst; `then` runs once the bytes are there.
cl_int Read(Command& cmd, cl_mem mem, bool blocking, size_t offset, size_t size, void* dst,
            std::function<void()> then, std::string_view call) {
  ir::BufferReadReq req;
  req.stream = cmd.q->stream;
  if (cl_int err = Acquire(cmd, mem, BufferUse::kRead, &req.buffer)) return err;
  req.offset = mem->origin + offset;
  req.size = size;
  req.wait = cmd.wait;
  req.signal = cmd.signal();
  auto op = std::make_shared<HostOp>(cmd.q, cmd.event);
  client::Session& s = cmd.q->session();
  if (blocking) {
    Status st = client::ReadBuffer(s, std::move(req), dst, true);
    RouteAsyncErrors(s);
    if (st.ok() && then) then();
    op->Complete(st, call);
    if (st.ok()) return TakeUnclaimedFailure(cmd.q);
    return ToCl(st, call, CL_INVALID_MEM_OBJECT);
  }
  std::string name(call);
  Status st = client::ReadBuffer(s, std::move(req), dst, false, [op, then, name](const Status& st) {
    if (st.ok() && then) then();
    op->Complete(st, name);
  });
  if (!st.ok()) op->Complete(st, call);
  return ToCl(st, call, CL_INVALID_MEM_OBJECT);
}

// Writes size bytes from src at offset of mem; `done` (optional) runs once src may be reused.
// With `signals`, the write signals the command's event (which Acquire may only now create).
Status Write(Command& cmd, cl_mem mem, bool blocking, size_t offset, size_t size, const void* src, bool signals,
             std::function<void(const Status&)> done = {}) {
  ir::BufferWriteReq req;
  req.stream = cmd.q->stream;
  if (cl_int err = Acquire(cmd, mem, WholeRoot(mem, offset, size) ? BufferUse::kOverwrite : BufferUse::kWrite,
                           &req.buffer, offset, size))
    return Status(Code::kApiError, "cannot bring the buffer to this queue's server", err, Api::kOpenCL);
  req.offset = mem->origin + offset;
  req.size = size;
  req.wait = cmd.wait;
  req.signal = signals ? cmd.signal() : 0;
  return client::WriteBuffer(cmd.q->session(), std::move(req), src, blocking, std::move(done));
}

// A marker on the queue: how commands that move no data get their event.
void PostMarker(Command& cmd, bool barrier) {
  cmd.q->session().Post(ir::MarkerReq{cmd.q->stream, barrier ? 1u : 0u, cmd.wait, cmd.signal()});
}

bool HostMayRead(cl_mem mem) { return !(mem->flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS)); }
bool HostMayWrite(cl_mem mem) { return !(mem->flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS)); }

// ---- rectangles ---------------------------------------------------------------------------

struct Rect {
  size_t origin[3];
  size_t row, slice;
  size_t Offset(size_t y, size_t z) const { return (origin[2] + z) * slice + (origin[1] + y) * row + origin[0]; }
};

// Fills in tight pitches for zeros and checks the rest (CL_INVALID_VALUE).
cl_int MakeRect(const size_t* origin, const size_t* region, size_t row, size_t slice, Rect* r) {
  if (!origin || !region || region[0] == 0 || region[1] == 0 || region[2] == 0) return CL_INVALID_VALUE;
  if (row == 0) row = region[0];
  size_t plane;  // bytes of one tight slice
  if (__builtin_mul_overflow(region[1], row, &plane)) return CL_INVALID_VALUE;
  if (slice == 0) slice = plane;
  if (row < region[0] || slice < plane || slice % row) return CL_INVALID_VALUE;
  // Every offset the rectangle reaches must be representable (RectEnd and Offset rely on it).
  size_t z, y, end;
  if (__builtin_add_overflow(origin[2], region[2] - 1, &z) || __builtin_mul_overflow(z, slice, &z) ||
      __builtin_add_overflow(origin[1], region[1] - 1, &y) || __builtin_mul_overflow(y, row, &y) ||
      __builtin_add_overflow(z, y, &end) || __builtin_add_overflow(end, origin[0], &end) ||
      __builtin_add_overflow(end, region[0], &end))
    return CL_INVALID_VALUE;
  *r = Rect{{origin[0], origin[1], origin[2]}, row, slice};
  return CL_SUCCESS;
}

// One past the last byte a rectangle touches.
size_t RectEnd(const Rect& r, const size_t* region) { return r.Offset(region[1] - 1, region[2] - 1) + region[0]; }

// Contiguous runs of a rectangle transfer: (buffer offset, host offset, length).
std::vector<std::array<size_t, 3>> Runs(const Rect& buf, const Rect& host, const size_t* region) {
  std::vector<std::array<size_t, 3>> runs;
  for (size_t z = 0; z < region[2]; ++z) {
    for (size_t y = 0; y < region[1]; ++y) {
      size_t b = buf.Offset(y, z), h = host.Offset(y, z);
      if (!runs.empty() && runs.back()[0] + runs.back()[2] == b && runs.back()[1] + runs.back()[2] == h) {
        runs.back()[2] += region[0];
      } else {
        runs.push_back({b, h, region[0]});
      }
    }
  }
  return runs;
}

// Whether two rectangles of one root buffer (at byte origins `so` and `do_` of it) share a
// byte. With the same pitches, the specification's own test (check_copy_overlap, in the
// OpenCL 1.1 specification's appendix): rows that interleave without touching do not
// overlap. Otherwise their byte ranges are compared, which may refuse a copy that would not
// overlap, never allow one that does.
bool RectsOverlap(const Rect& s, size_t so, const Rect& d, size_t do_, const size_t* region) {
  const size_t s0 = so + s.Offset(0, 0), s1 = so + RectEnd(s, region);
  const size_t d0 = do_ + d.Offset(0, 0), d1 = do_ + RectEnd(d, region);
  if (d1 <= s0 || s1 <= d0) return false;
  if (s.row != d.row || s.slice != d.slice) return true;
  const size_t row = s.row, slice = s.slice;
  const size_t plane = (region[1] - 1) * row + region[0];  // bytes one slice of the region spans
  const size_t src_dx = s0 % row, dst_dx = d0 % row;
  if ((dst_dx >= src_dx + region[0] && dst_dx + region[0] <= src_dx + row) ||
      (src_dx >= dst_dx + region[0] && src_dx + region[0] <= dst_dx + row))
    return false;
  const size_t src_dy = s0 % slice, dst_dy = d0 % slice;
  if ((dst_dy >= src_dy + plane && dst_dy + plane <= src_dy + slice) ||
      (src_dy >= dst_dy + plane && src_dy + plane <= dst_dy + slice))
    return false;
  return true;
}

// Waits for a number of completions.
class Countdown {
 public:
  explicit Countdown(size_t n) : left_(n) {}
  void Done() {
    std::lock_guard lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_;
};

void* AlignedStaging(size_t size) {
  constexpr size_t kAlign = 128;  // enough for any OpenCL vector type
  return std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign);
}

}  // namespace

// ---- reads and writes ---------------------------------------------------------------------------

cl_int EnqueueReadBuffer(cl_command_queue q, cl_mem mem, cl_bool blocking, size_t offset, size_t size, void* ptr,
                         cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_READ_BUFFER, Completion::kHost, &cmd)) return End(cmd, out, err);
  cl_int err = CheckMem(cmd, mem);
  if (!err) err = CheckRange(mem, offset, size);
  if (!err && !ptr) err = CL_INVALID_VALUE;
  if (!err && !HostMayRead(mem)) err = CL_INVALID_OPERATION;
  if (!err) err = Read(cmd, mem, blocking, offset, size, ptr, {}, "clEnqueueReadBuffer");
  return End(cmd, out, err);
}

cl_int EnqueueWriteBuffer(cl_command_queue q, cl_mem mem, cl_bool blocking, size_t offset, size_t size,
                          const void* ptr, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_WRITE_BUFFER, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  cl_int err = CheckMem(cmd, mem);
  if (!err) err = CheckRange(mem, offset, size);
  if (!err && !ptr) err = CL_INVALID_VALUE;
  if (!err && !HostMayWrite(mem)) err = CL_INVALID_OPERATION;
  if (!err) err = ToCl(Write(cmd, mem, blocking, offset, size, ptr, true), "clEnqueueWriteBuffer");
  return End(cmd, out, err);
}

// The checks a read or write rectangle shares: both rectangles, the buffer's bounds, the
// host pointer and the host access the buffer allows.
cl_int CheckRectTransfer(Command& cmd, cl_mem mem, const size_t* buffer_origin, const size_t* host_origin,
                         const size_t* region, size_t buffer_row_pitch, size_t buffer_slice_pitch,
                         size_t host_row_pitch, size_t host_slice_pitch, const void* ptr, bool host_reads,
                         Rect* buf, Rect* host) {
  cl_int err = CheckMem(cmd, mem);
  if (!err) err = MakeRect(buffer_origin, region, buffer_row_pitch, buffer_slice_pitch, buf);
  if (!err) err = MakeRect(host_origin, region, host_row_pitch, host_slice_pitch, host);
  if (!err && (!ptr || RectEnd(*buf, region) > mem->size)) err = CL_INVALID_VALUE;
  if (!err && !(host_reads ? HostMayRead(mem) : HostMayWrite(mem))) err = CL_INVALID_OPERATION;
  return err;
}

// Fetches the rectangle's bounding range once and scatters its rows into host memory.
cl_int EnqueueReadBufferRect(cl_command_queue q, cl_mem mem, cl_bool blocking, const size_t* buffer_origin,
                             const size_t* host_origin, const size_t* region, size_t buffer_row_pitch,
                             size_t buffer_slice_pitch, size_t host_row_pitch, size_t host_slice_pitch, void* ptr,
                             cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_READ_BUFFER_RECT, Completion::kHost, &cmd))
    return End(cmd, out, err);
  Rect buf, host;
  cl_int err = CheckRectTransfer(cmd, mem, buffer_origin, host_origin, region, buffer_row_pitch, buffer_slice_pitch,
                                 host_row_pitch, host_slice_pitch, ptr, /*host_reads=*/true, &buf, &host);
  if (err) return End(cmd, out, err);
  size_t lo = buf.Offset(0, 0), hi = RectEnd(buf, region);
  auto staging = std::make_shared<std::vector<uint8_t>>(hi - lo);
  auto runs = Runs(buf, host, region);
  auto scatter = [staging, runs, lo, ptr] {
    for (const auto& [b, h, len] : runs) std::memcpy(static_cast<uint8_t*>(ptr) + h, staging->data() + (b - lo), len);
  };
  err = Read(cmd, mem, blocking, lo, hi - lo, staging->data(), scatter, "clEnqueueReadBufferRect");
  return End(cmd, out, err);
}

// Writes the rectangle as contiguous runs (rows, merged where they touch); a marker
// carries the event so that it covers every run, also on out-of-order queues.
cl_int EnqueueWriteBufferRect(cl_command_queue q, cl_mem mem, cl_bool blocking, const size_t* buffer_origin,
                              const size_t* host_origin, const size_t* region, size_t buffer_row_pitch,
                              size_t buffer_slice_pitch, size_t host_row_pitch, size_t host_slice_pitch,
                              const void* ptr, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_WRITE_BUFFER_RECT, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  Rect buf, host;
  cl_int err = CheckRectTransfer(cmd, mem, buffer_origin, host_origin, region, buffer_row_pitch, buffer_slice_pitch,
                                 host_row_pitch, host_slice_pitch, ptr, /*host_reads=*/false, &buf, &host);
  if (err) return End(cmd, out, err);
  auto runs = Runs(buf, host, region);
  // Blocking: wait until every run's source bytes have been taken.
  auto taken = std::make_shared<Countdown>(runs.size());
  Status first;
  for (const auto& [b, h, len] : runs) {
    auto once = std::make_shared<std::atomic<bool>>(false);
    auto fire = [taken, once](const Status&) {
      if (!once->exchange(true)) taken->Done();
    };
    Status st = Write(cmd, mem, false, b, len, static_cast<const uint8_t*>(ptr) + h, false, fire);
    if (!st.ok()) {
      fire(st);
      if (first.ok()) first = st;
    }
  }
  if (cmd.event) {
    Command after{cmd.q, {}, cmd.event};
    PostMarker(after, false);
  }
  if (blocking) {
    cmd.q->session().Flush();
    taken->Wait();
  }
  return End(cmd, out, ToCl(first, "clEnqueueWriteBufferRect", CL_INVALID_MEM_OBJECT));
}

// ---- copies and fills ------------------------------------------------------------------------

cl_int EnqueueCopyBuffer(cl_command_queue q, cl_mem src, cl_mem dst, size_t src_offset, size_t dst_offset,
                         size_t size, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_COPY_BUFFER, Completion::kRemote, &cmd)) return End(cmd, out, err);
  cl_int err = CheckMem(cmd, src);
  if (!err) err = CheckMem(cmd, dst);
  if (!err) err = CheckRange(src, src_offset, size);
  if (!err) err = CheckRange(dst, dst_offset, size);
  if (err) return End(cmd, out, err);
  size_t s0 = src->origin + src_offset, d0 = dst->origin + dst_offset;
  if (src->remote() == dst->remote() && s0 < d0 + size && d0 < s0 + size) return End(cmd, out, CL_MEM_COPY_OVERLAP);
  uint64_t sh = 0, dh = 0;
  const BufferUse dst_use = WholeRoot(dst, dst_offset, size) ? BufferUse::kOverwrite : BufferUse::kWrite;
  if (src->root() != dst->root() && !CurrentOn(q, src)) {
    // The source's bytes are on another server: only the range travels, server to server.
    client::CopyEnd from = CurrentSource(src, s0, s0 + size);
    from.offset = s0;
    for (uint64_t h : HandlesOn(cmd.foreign, from.session)) from.wait.push_back(h);
    if (cl_int e = Acquire(cmd, dst, dst_use, &dh, dst_offset, size)) return End(cmd, out, e);
    client::CopyEnd to{.session = &q->session(), .stream = q->stream, .buffer = dh, .offset = d0, .wait = cmd.wait};
    Status st = client::CopyBetweenServers(from, to, size, cmd.signal());
    return End(cmd, out, ToCl(st, "clEnqueueCopyBuffer", CL_MEM_OBJECT_ALLOCATION_FAILURE));
  }
  if (cl_int e = Acquire(cmd, src, BufferUse::kRead, &sh)) return End(cmd, out, e);
  if (cl_int e = Acquire(cmd, dst, dst_use, &dh, dst_offset, size)) return End(cmd, out, e);
  q->session().Post(ir::BufferCopyReq{q->stream, sh, s0, dh, d0, size, cmd.wait, cmd.signal()});
  return End(cmd, out, CL_SUCCESS);
}

cl_int EnqueueCopyBufferRect(cl_command_queue q, cl_mem src, cl_mem dst, const size_t* src_origin,
                             const size_t* dst_origin, const size_t* region, size_t src_row_pitch,
                             size_t src_slice_pitch, size_t dst_row_pitch, size_t dst_slice_pitch, cl_uint n,
                             const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_COPY_BUFFER_RECT, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  Rect s, d;
  cl_int err = CheckMem(cmd, src);
  if (!err) err = CheckMem(cmd, dst);
  if (!err) err = MakeRect(src_origin, region, src_row_pitch, src_slice_pitch, &s);
  if (!err) err = MakeRect(dst_origin, region, dst_row_pitch, dst_slice_pitch, &d);
  if (!err && (RectEnd(s, region) > src->size || RectEnd(d, region) > dst->size)) err = CL_INVALID_VALUE;
  if (!err && src == dst && (s.row != d.row || s.slice != d.slice)) err = CL_INVALID_VALUE;
  if (err) return End(cmd, out, err);
  if (src->remote() == dst->remote() && RectsOverlap(s, src->origin, d, dst->origin, region))
    return End(cmd, out, CL_MEM_COPY_OVERLAP);
  // Sub-buffer origins fold into the x origin (bytes).
  ir::BufferCopyRectReq req;
  req.stream = q->stream;
  if (cl_int e = Acquire(cmd, src, BufferUse::kRead, &req.src)) return End(cmd, out, e);
  if (cl_int e = Acquire(cmd, dst, BufferUse::kWrite, &req.dst)) return End(cmd, out, e);
  req.src_origin = {src_origin[0] + src->origin, src_origin[1], src_origin[2]};
  req.dst_origin = {dst_origin[0] + dst->origin, dst_origin[1], dst_origin[2]};
  req.region = {region[0], region[1], region[2]};
  req.pitches = {s.row, s.slice, d.row, d.slice};
  req.wait = cmd.wait;
  req.signal = cmd.signal();
  q->session().Post(req);
  return End(cmd, out, CL_SUCCESS);
}

cl_int EnqueueFillBuffer(cl_command_queue q, cl_mem mem, const void* pattern, size_t pattern_size, size_t offset,
                         size_t size, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_FILL_BUFFER, Completion::kRemote, &cmd)) return End(cmd, out, err);
  cl_int err = CheckMem(cmd, mem);
  if (!err) err = CheckRange(mem, offset, size);
  bool pow2 = pattern_size && (pattern_size & (pattern_size - 1)) == 0 && pattern_size <= 128;
  if (!err && (!pattern || !pow2 || offset % pattern_size || size % pattern_size)) err = CL_INVALID_VALUE;
  if (err) return End(cmd, out, err);
  const auto* p = static_cast<const uint8_t*>(pattern);
  uint64_t h = 0;
  if (cl_int e = Acquire(cmd, mem, WholeRoot(mem, offset, size) ? BufferUse::kOverwrite : BufferUse::kWrite, &h,
                         offset, size))
    return End(cmd, out, e);
  q->session().Post(ir::BufferFillReq{q->stream, h, mem->origin + offset, size,
                                      std::vector<uint8_t>(p, p + pattern_size), cmd.wait, cmd.signal()});
  return End(cmd, out, CL_SUCCESS);
}

// ---- map / unmap --------------------------------------------------------------------------------

// Maps a region into host memory: the buffer's own host pointer (USE_HOST_PTR) or a
// staging copy, filled by a read unless the map invalidates the region.
void* EnqueueMapBuffer(cl_command_queue q, cl_mem mem, cl_bool blocking, cl_map_flags flags, size_t offset,
                       size_t size, cl_uint n, const cl_event* list, cl_event* out, cl_int* errcode_ret) {
  Command cmd;
  cl_event* want = out;
  // No flags: read and write, as PoCL and NVIDIA's OpenCL take it.
  if (flags == 0) flags = CL_MAP_READ | CL_MAP_WRITE;
  bool reads = !(flags & CL_MAP_WRITE_INVALIDATE_REGION);
  cl_int err = Begin(q, n, list, want, CL_COMMAND_MAP_BUFFER, reads ? Completion::kHost : Completion::kRemote, &cmd);
  if (!err) err = CheckMem(cmd, mem);
  if (!err) err = CheckRange(mem, offset, size);
  constexpr cl_map_flags kKnown = CL_MAP_READ | CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION;
  if (!err && ((flags & ~kKnown) || ((flags & CL_MAP_WRITE_INVALIDATE_REGION) && (flags & (CL_MAP_READ | CL_MAP_WRITE)))))
    err = CL_INVALID_VALUE;
  if (!err && (((flags & CL_MAP_READ) && !HostMayRead(mem)) ||
               ((flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) && !HostMayWrite(mem))))
    err = CL_INVALID_OPERATION;
  if (err) return SetErr(errcode_ret, End(cmd, out, err)), nullptr;

  _cl_mem::Mapping m;
  m.offset = offset;
  m.size = size;
  m.flags = flags;
  if (mem->host_ptr) {
    m.ptr = static_cast<uint8_t*>(mem->host_ptr) + offset;
  } else {
    m.staging.reset(static_cast<uint8_t*>(AlignedStaging(size)), std::free);
    if (!m.staging) return SetErr(errcode_ret, End(cmd, out, CL_OUT_OF_HOST_MEMORY)), nullptr;
    m.ptr = m.staging.get();
  }
  if (reads) {
    auto keep = m.staging;
    err = Read(cmd, mem, blocking, offset, size, m.ptr, [keep] {}, "clEnqueueMapBuffer");
  } else if (cmd.event || blocking || !cmd.wait.empty()) {
    // Nothing to read, but the map is still a command of the queue: it waits for its list, and
    // a blocking one returns only once it (and so what the queue held before it) is done.
    PostMarker(cmd, false);
    if (blocking) err = Finish(q);
  }
  if (err) return SetErr(errcode_ret, End(cmd, out, err)), nullptr;
  void* ptr = m.ptr;
  {
    std::lock_guard lock(mem->mu);
    mem->maps.push_back(std::move(m));
  }
  SetErr(errcode_ret, End(cmd, out, CL_SUCCESS));
  return ptr;
}

// Writes back what was mapped for writing, then lets the staging copy go.
cl_int EnqueueUnmapMemObject(cl_command_queue q, cl_mem mem, void* ptr, cl_uint n, const cl_event* list,
                             cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_UNMAP_MEM_OBJECT, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  if (cl_int err = CheckMem(cmd, mem)) return End(cmd, out, err);
  _cl_mem::Mapping m;
  {
    std::lock_guard lock(mem->mu);
    auto it = std::find_if(mem->maps.begin(), mem->maps.end(), [ptr](const auto& x) { return x.ptr == ptr; });
    if (it == mem->maps.end()) return End(cmd, out, CL_INVALID_VALUE);
    m = std::move(*it);
    mem->maps.erase(it);
  }
  if (m.flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) {
    auto keep = m.staging;
    Status st = Write(cmd, mem, false, m.offset, m.size, m.ptr, true, [keep](const Status&) {});
    return End(cmd, out, ToCl(st, "clEnqueueUnmapMemObject", CL_INVALID_MEM_OBJECT));
  }
  if (cmd.event) PostMarker(cmd, false);
  return End(cmd, out, CL_SUCCESS);
}

// Brings each buffer's current bytes to the queue's server (server to server), or only a
// place for them with CONTENT_UNDEFINED; migrating to the host leaves them where they are.
cl_int EnqueueMigrateMemObjects(cl_command_queue q, cl_uint num_mems, const cl_mem* mems, cl_mem_migration_flags flags,
                                cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_MIGRATE_MEM_OBJECTS, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  if (num_mems == 0 || !mems || (flags & ~cl_mem_migration_flags{CL_MIGRATE_MEM_OBJECT_HOST |
                                                                  CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED}))
    return End(cmd, out, CL_INVALID_VALUE);
  for (cl_uint i = 0; i < num_mems; ++i)
    if (cl_int err = CheckMem(cmd, mems[i])) return End(cmd, out, err);
  if (!(flags & CL_MIGRATE_MEM_OBJECT_HOST)) {
    const BufferUse use =
        (flags & CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED) ? BufferUse::kOverwrite : BufferUse::kRead;
    for (cl_uint i = 0; i < num_mems; ++i) {
      uint64_t h = 0;
      if (cl_int err = Acquire(cmd, mems[i], use, &h)) return End(cmd, out, err);
    }
  }
  PostMarker(cmd, false);
  return End(cmd, out, CL_SUCCESS);
}

// ---- kernels ------------------------------------------------------------------------------------

cl_int EnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t* global_offset,
                            const size_t* global, const size_t* local, cl_uint n, const cl_event* list,
                            cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_NDRANGE_KERNEL, Completion::kRemote, &cmd))
    return End(cmd, out, err);
  if (!Valid(k)) return End(cmd, out, CL_INVALID_KERNEL);
  if (k->program->context != q->context) return End(cmd, out, CL_INVALID_CONTEXT);
  uint64_t fn = k->FunctionFor(q->device);
  const ir::FunctionInfo* fi = k->InfoFor(q->device);
  if (!fn || !fi) return End(cmd, out, CL_INVALID_PROGRAM_EXECUTABLE);
  const _cl_device_id& dev = *q->device;
  if (dims < 1 || dims > 3 || (!dev.max_item_sizes.empty() && dims > dev.max_item_sizes.size()))
    return End(cmd, out, CL_INVALID_WORK_DIMENSION);
  if (!global) return End(cmd, out, CL_INVALID_VALUE);
  for (cl_uint i = 0; i < dims; ++i)
    if (global[i] == 0) return End(cmd, out, CL_INVALID_GLOBAL_WORK_SIZE);

  // Work-group checks, as the spec orders them.
  bool reqd = std::any_of(fi->compile_block.begin(), fi->compile_block.end(), [](uint64_t v) { return v != 0; });
  if (local) {
    size_t total = 1;
    for (cl_uint i = 0; i < dims; ++i) {
      if (local[i] == 0 || global[i] % local[i]) return End(cmd, out, CL_INVALID_WORK_GROUP_SIZE);
      if (reqd && (i >= fi->compile_block.size() || local[i] != fi->compile_block[i]))
        return End(cmd, out, CL_INVALID_WORK_GROUP_SIZE);
      if (i < dev.max_item_sizes.size() && local[i] > dev.max_item_sizes[i])
        return End(cmd, out, CL_INVALID_WORK_ITEM_SIZE);
      total *= local[i];
    }
    if ((fi->max_block && total > fi->max_block) || (dev.max_work_group && total > dev.max_work_group))
      return End(cmd, out, CL_INVALID_WORK_GROUP_SIZE);
  } else if (reqd) {
    return End(cmd, out, CL_INVALID_WORK_GROUP_SIZE);
  }

  ir::LaunchReq req;
  req.stream = q->stream;
  req.function = fn;
  req.dims = dims;
  req.grid.assign(global, global + dims);
  if (local) req.block.assign(local, local + dims);
  if (global_offset) req.offset.assign(global_offset, global_offset + dims);
  {
    std::lock_guard lock(k->mu);
    for (const auto& a : k->args) {
      if (!a.set) return End(cmd, out, CL_INVALID_KERNEL_ARGS);
      uint64_t value = a.value;
      if (a.kind == ir::ArgKind::kBuffer) {
        // Read-only buffers stay current wherever they are; any other may be written.
        if (!Valid(a.mem)) return End(cmd, out, CL_INVALID_KERNEL_ARGS);
        const BufferUse use = (a.mem->flags & CL_MEM_READ_ONLY) ? BufferUse::kRead : BufferUse::kWrite;
        if (cl_int e = Acquire(cmd, a.mem, use, &value)) return End(cmd, out, e);
      }
      req.args.push_back(ir::LaunchArg{static_cast<uint32_t>(a.kind), value, a.data});
      // A sub-buffer inside its buffer: the server passes the kernel a sub-buffer of that range.
      if (a.kind == ir::ArgKind::kBuffer && a.offset) req.args.back().data = ir::SubRange(a.offset, a.size);
    }
  }
  req.wait = std::move(cmd.wait);
  req.signal = cmd.signal();
  q->session().Post(req);
  return End(cmd, out, CL_SUCCESS);
}

cl_int EnqueueTask(cl_command_queue q, cl_kernel k, cl_uint n, const cl_event* list, cl_event* out) {
  const size_t one = 1;
  return EnqueueNDRangeKernel(q, k, 1, nullptr, &one, &one, n, list, out);
}

// ---- markers and barriers -----------------------------------------------------------------------

cl_int EnqueueMarkerWithWaitList(cl_command_queue q, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_MARKER, Completion::kRemote, &cmd)) return End(cmd, out, err);
  PostMarker(cmd, false);
  return End(cmd, out, CL_SUCCESS);
}

cl_int EnqueueBarrierWithWaitList(cl_command_queue q, cl_uint n, const cl_event* list, cl_event* out) {
  Command cmd;
  if (cl_int err = Begin(q, n, list, out, CL_COMMAND_BARRIER, Completion::kRemote, &cmd)) return End(cmd, out, err);
  PostMarker(cmd, true);
  return End(cmd, out, CL_SUCCESS);
}

cl_int EnqueueMarker(cl_command_queue q, cl_event* out) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (!out) return CL_INVALID_VALUE;
  return EnqueueMarkerWithWaitList(q, 0, nullptr, out);
}

cl_int EnqueueWaitForEvents(cl_command_queue q, cl_uint n, const cl_event* list) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (n == 0 || !list) return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < n; ++i)
    if (!Valid(list[i])) return CL_INVALID_EVENT;
  return EnqueueBarrierWithWaitList(q, n, list, nullptr);
}

cl_int EnqueueBarrier(cl_command_queue q) { return EnqueueBarrierWithWaitList(q, 0, nullptr, nullptr); }

}  // namespace tandem::ocl
