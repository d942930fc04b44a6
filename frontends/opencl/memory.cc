// Buffers and sub-buffers. A buffer is a remote allocation on the server of its context's
// first device (BufferAlloc, posted), plus a copy on each other server whose queues use it,
// kept coherent by server-to-server copies (AcquireBuffer); a sub-buffer is a client-side
// view (parent + origin) whose offsets are rewritten on the client. Host-pointer buffers get an initial upload;
// USE_HOST_PTR memory is synchronised at map/unmap (enqueue.cc).
#include <algorithm>
#include <thread>

#include "objects.h"
#include "tandem/thread_name.h"

namespace tandem::ocl {
namespace {

constexpr cl_mem_flags kAccessFlags = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
constexpr cl_mem_flags kHostPtrFlags = CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
constexpr cl_mem_flags kHostAccessFlags = CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

// At most one bit of `group` may be set.
bool AtMostOne(cl_mem_flags flags, cl_mem_flags group) {
  cl_mem_flags f = flags & group;
  return (f & (f - 1)) == 0;
}

cl_int CheckFlags(cl_mem_flags flags) {
  if (flags & ~(kAccessFlags | kHostPtrFlags | kHostAccessFlags)) return CL_INVALID_VALUE;
  if (!AtMostOne(flags, kAccessFlags) || !AtMostOne(flags, kHostAccessFlags)) return CL_INVALID_VALUE;
  if ((flags & CL_MEM_USE_HOST_PTR) && (flags & (CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR))) return CL_INVALID_VALUE;
  return CL_SUCCESS;
}

uint64_t IrFlags(cl_mem_flags flags) {
  uint64_t f = 0;
  if (flags & CL_MEM_READ_ONLY) f |= ir::kBufferReadOnly;
  if (flags & CL_MEM_WRITE_ONLY) f |= ir::kBufferWriteOnly;
  if (flags & CL_MEM_ALLOC_HOST_PTR) f |= ir::kBufferHostAccessible;
  return f;
}

}  // namespace

cl_mem CreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void* host_ptr, cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  if (CheckFlags(flags) != CL_SUCCESS) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  if (size == 0) return SetErr(errcode_ret, CL_INVALID_BUFFER_SIZE), nullptr;
  bool any_fits = false;
  for (cl_device_id d : context->devices) any_fits |= d->max_alloc == 0 || size <= d->max_alloc;
  if (!any_fits) return SetErr(errcode_ret, CL_INVALID_BUFFER_SIZE), nullptr;
  bool wants_ptr = flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR);
  if (wants_ptr != (host_ptr != nullptr)) return SetErr(errcode_ret, CL_INVALID_HOST_PTR), nullptr;
  if (!(flags & kAccessFlags)) flags |= CL_MEM_READ_WRITE;

  auto mem = std::make_unique<_cl_mem>();
  mem->context = context;
  mem->flags = flags;
  mem->size = size;
  mem->host_ptr = (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr;
  mem->resident = context->home();
  mem->handle = client::Runtime::Get().NewHandle();
  client::Session& s = mem->session();
  s.Post(ir::BufferAllocReq{mem->handle, mem->resident->remote->remote_index, size, IrFlags(flags), 0});
  mem->copies.push_back(_cl_mem::Copy{
      .session = &s, .device = mem->resident->remote->remote_index, .handle = mem->handle, .writes = {}, .current = true});
  // The initial contents travel from a private copy, so creation does not wait.
  if (wants_ptr) {
    auto copy = std::make_shared<std::vector<uint8_t>>(static_cast<uint8_t*>(host_ptr),
                                                       static_cast<uint8_t*>(host_ptr) + size);
    mem->ready = client::Runtime::Get().NewHandle();
    ir::BufferWriteReq req;
    req.buffer = mem->handle;
    req.size = size;
    req.signal = mem->ready;
    Status st = client::WriteBuffer(s, std::move(req), copy->data(), false, [copy](const Status&) {});
    if (!st.ok()) {
      s.Post(ir::BufferFreeReq{mem->handle});
      return SetErr(errcode_ret, ToCl(st, "clCreateBuffer")), nullptr;
    }
  }
  context->Hold();
  SetErr(errcode_ret, CL_SUCCESS);
  return Publish(mem.release());
}

cl_mem CreateSubBuffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type, const void* info,
                       cl_int* errcode_ret) {
  if (!Valid(buffer) || buffer->parent) return SetErr(errcode_ret, CL_INVALID_MEM_OBJECT), nullptr;
  if (type != CL_BUFFER_CREATE_TYPE_REGION || !info) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  if (CheckFlags(flags) != CL_SUCCESS || (flags & kHostPtrFlags)) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  // Access may only narrow the parent's.
  cl_mem_flags parent = buffer->flags;
  if (((parent & CL_MEM_WRITE_ONLY) && (flags & (CL_MEM_READ_WRITE | CL_MEM_READ_ONLY))) ||
      ((parent & CL_MEM_READ_ONLY) && (flags & (CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY))) ||
      ((parent & CL_MEM_HOST_WRITE_ONLY) && (flags & CL_MEM_HOST_READ_ONLY)) ||
      ((parent & CL_MEM_HOST_READ_ONLY) && (flags & CL_MEM_HOST_WRITE_ONLY)) ||
      ((parent & CL_MEM_HOST_NO_ACCESS) && (flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY))))
    return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  const auto* region = static_cast<const cl_buffer_region*>(info);
  if (region->size == 0) return SetErr(errcode_ret, CL_INVALID_BUFFER_SIZE), nullptr;
  if (region->origin > buffer->size || region->size > buffer->size - region->origin)
    return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  bool aligned = false;
  for (cl_device_id d : buffer->context->devices) aligned |= region->origin % std::max<cl_uint>(d->base_align_bits / 8, 1) == 0;
  if (!aligned) return SetErr(errcode_ret, CL_MISALIGNED_SUB_BUFFER_OFFSET), nullptr;

  auto mem = std::make_unique<_cl_mem>();
  mem->context = buffer->context;
  mem->flags = (flags & kAccessFlags ? flags & kAccessFlags : parent & kAccessFlags) |
               (flags & kHostAccessFlags ? flags & kHostAccessFlags : parent & kHostAccessFlags) |
               (parent & kHostPtrFlags);
  mem->size = region->size;
  mem->parent = buffer;
  mem->origin = region->origin;
  mem->host_ptr = buffer->host_ptr ? static_cast<uint8_t*>(buffer->host_ptr) + region->origin : nullptr;
  buffer->Hold();
  mem->context->Hold();
  SetErr(errcode_ret, CL_SUCCESS);
  return Publish(mem.release());
}

// ---- residency across servers ----------------------------------------------------------

namespace {
// The copy of `root` for the device of queue q, or nullptr. Called with residency_mu held.
_cl_mem::Copy* CopyOn(_cl_mem* root, cl_command_queue q) {
  for (auto& c : root->copies)
    if (c.session == &q->session() && c.device == q->device->remote->remote_index) return &c;
  return nullptr;
}

_cl_mem* MutableRoot(cl_mem mem) { return mem->parent ? mem->parent : mem; }

// Writes a copy keeps apart; past that the oldest two merge (their ranges' span, both events).
constexpr size_t kMaxWrites = 8;

bool Completed(const Held<_cl_event>& e) {
  std::lock_guard lock(e->mu);
  return e->status == CL_COMPLETE;
}

// Records that `writer` (null: no event to wait for) writes [lo, hi) of copy c of `root`.
void RecordWrite(const _cl_mem* root, _cl_mem::Copy& c, uint64_t lo, uint64_t hi, cl_event writer) {
  hi = std::min<uint64_t>(hi, root->size);
  if (lo == 0 && hi == root->size) {
    c.writes.clear();
  } else {
    std::erase_if(c.writes, [](const _cl_mem::Write& w) { return std::ranges::all_of(w.events, Completed); });
  }
  _cl_mem::Write w{.lo = lo, .hi = hi, .events = {}};
  if (writer) w.events.emplace_back(writer);
  c.writes.push_back(std::move(w));
  while (c.writes.size() > kMaxWrites) {
    _cl_mem::Write& a = c.writes[0];
    _cl_mem::Write& b = c.writes[1];
    b.lo = std::min(a.lo, b.lo);
    b.hi = std::max(a.hi, b.hi);
    b.events.insert(b.events.begin(), a.events.begin(), a.events.end());
    c.writes.erase(c.writes.begin());
  }
}

// The source end of a copy of [lo, hi) from root's first current copy, waiting for the writes
// of that range. Called with residency_mu held.
client::CopyEnd SourceOf(_cl_mem* root, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i < root->copies.size(); ++i) {
    const auto& c = root->copies[i];
    if (!c.current) continue;
    client::CopyEnd end{.session = c.session, .stream = 0, .buffer = c.handle, .offset = 0};
    for (const auto& w : c.writes) {
      if (w.hi <= lo || hi <= w.lo) continue;
      for (const auto& e : w.events) {
        if (!e->bound || Completed(e)) continue;
        if (std::find(end.wait.begin(), end.wait.end(), e->handle) == end.wait.end()) end.wait.push_back(e->handle);
      }
    }
    // The home copy may still be waiting for its initial upload.
    if (i == 0 && root->ready) end.wait.push_back(root->ready);
    return end;
  }
  return {};  // unreachable: some copy is always current
}
}  // namespace

bool CurrentOn(cl_command_queue q, cl_mem mem) {
  _cl_mem* root = MutableRoot(mem);
  std::lock_guard lock(root->residency_mu);
  const _cl_mem::Copy* c = CopyOn(root, q);
  return c && c->current;
}

client::CopyEnd CurrentSource(cl_mem mem, uint64_t lo, uint64_t hi) {
  _cl_mem* root = MutableRoot(mem);
  std::lock_guard lock(root->residency_mu);
  return SourceOf(root, lo, hi);
}

bool SpansServers(cl_context context) {
  for (cl_device_id d : context->devices)
    if (&d->session() != &context->home()->session()) return true;
  return false;
}

cl_int AcquireBuffer(cl_command_queue q, cl_mem mem, BufferUse use, uint64_t* handle, std::vector<uint64_t>* wait,
                     const std::vector<cl_event>& foreign, cl_event writer, uint64_t lo, uint64_t hi) {
  _cl_mem* root = MutableRoot(mem);
  mem->NoteQueue(q);
  if (root != mem) root->NoteQueue(q);
  client::Session* here = &q->session();
  std::lock_guard lock(root->residency_mu);
  _cl_mem::Copy* mine = CopyOn(root, q);
  if (!mine) {
    const uint64_t h = client::Runtime::Get().NewHandle();
    const uint32_t device = q->device->remote->remote_index;
    here->Post(ir::BufferAllocReq{h, device, root->size, IrFlags(root->flags), 0});
    root->copies.push_back(
        _cl_mem::Copy{.session = here, .device = device, .handle = h, .writes = {}, .current = false});
    mine = &root->copies.back();
  }
  const bool home = mine == &root->copies.front();
  if (home && root->ready && std::find(wait->begin(), wait->end(), root->ready) == wait->end())
    wait->push_back(root->ready);
  if (!mine->current && use != BufferUse::kOverwrite) {
    client::CopyEnd from = SourceOf(root, 0, root->size);
    for (uint64_t h : HandlesOn(foreign, from.session)) from.wait.push_back(h);
    client::CopyEnd to{.session = here, .stream = q->stream, .buffer = mine->handle, .offset = 0};
    cl_event filled = NewEvent(q->context, q, CL_COMMAND_MIGRATE_MEM_OBJECTS, _cl_event::Completion::kRemote);
    filled->internal = true;  // the program never sees it: a failed move is its queue's to report
    Status st = client::CopyBetweenServers(from, to, root->size, filled->handle);
    filled->bound = st.ok();
    if (st.ok()) RecordWrite(root, *mine, 0, root->size, filled);
    filled->Release();  // the copy holds it
    if (!st.ok()) return ToCl(st, "moving a buffer between servers", CL_MEM_OBJECT_ALLOCATION_FAILURE);
  }
  if (use == BufferUse::kRead) {
    mine->current = true;
  } else {
    for (auto& c : root->copies) c.current = &c == mine;
    RecordWrite(root, *mine, lo, hi, writer);
  }
  *handle = mine->handle;
  return CL_SUCCESS;
}

cl_int RetainMemObject(cl_mem mem) {
  if (!Valid(mem)) return CL_INVALID_MEM_OBJECT;
  mem->Retain();
  return CL_SUCCESS;
}

cl_int ReleaseMemObject(cl_mem mem) {
  if (!Valid(mem) || !mem->Release()) return CL_INVALID_MEM_OBJECT;
  return CL_SUCCESS;
}

cl_int SetMemObjectDestructorCallback(cl_mem mem, _cl_mem::Destructor fn, void* data) {
  if (!Valid(mem)) return CL_INVALID_MEM_OBJECT;
  if (!fn) return CL_INVALID_VALUE;
  std::lock_guard lock(mem->mu);
  mem->destructors.emplace_back(fn, data);
  return CL_SUCCESS;
}

cl_int GetMemObjectInfo(cl_mem mem, cl_mem_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(mem)) return CL_INVALID_MEM_OBJECT;
  switch (param) {
    case CL_MEM_TYPE:
      return AnswerValue(size, value, size_ret, cl_mem_object_type{CL_MEM_OBJECT_BUFFER});
    case CL_MEM_FLAGS:
      return AnswerValue(size, value, size_ret, mem->flags);
    case CL_MEM_SIZE:
      return AnswerValue(size, value, size_ret, mem->size);
    case CL_MEM_HOST_PTR:
      return AnswerValue(size, value, size_ret, mem->host_ptr);
    case CL_MEM_MAP_COUNT: {
      std::lock_guard lock(mem->mu);
      return AnswerValue(size, value, size_ret, static_cast<cl_uint>(mem->maps.size()));
    }
    case CL_MEM_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, mem->refs.load());
    case CL_MEM_CONTEXT:
      return AnswerValue(size, value, size_ret, mem->context);
    case CL_MEM_ASSOCIATED_MEMOBJECT:
      return AnswerValue(size, value, size_ret, mem->parent);
    case CL_MEM_OFFSET:
      return AnswerValue(size, value, size_ret, mem->origin);
    default:
      return CL_INVALID_VALUE;
  }
}

// Images are not supported: every query has no formats.
cl_int GetSupportedImageFormats(cl_context context, cl_mem_flags flags, cl_mem_object_type type, cl_uint num_entries,
                                cl_image_format* formats, cl_uint* num_formats) {
  if (!Valid(context)) return CL_INVALID_CONTEXT;
  if (num_entries == 0 && formats) return CL_INVALID_VALUE;
  if (num_formats) *num_formats = 0;
  return CL_SUCCESS;
}

}  // namespace tandem::ocl

// ---- object members (the objects live in the global namespace, as cl.h declares them) ----

using namespace tandem::ocl;  // NOLINT: member bodies call the family helpers

// Frees the remote buffer (a view has none) and runs the destructor callbacks, newest
// first, on the callback thread.
_cl_mem::~_cl_mem() {
  if (parent) {
    parent->Unhold();
  } else {
    if (ready) session().Post(tandem::ir::EventDestroyReq{ready});
    for (const Copy& c : copies) c.session->Post(tandem::ir::BufferFreeReq{c.handle});
  }
  cl_mem self = this;
  // Commands that use it may still be queued (a transfer may still be landing in its host
  // pointer, which a callback may free): each queue that used it and is still there gets a
  // marker now, and the callbacks run once those markers are done and the reads begun before
  // them have landed, off the application's thread (and off the callback thread).
  struct Mark {
    Held<_cl_command_queue> q;
    uint64_t event = 0;
    uint64_t reads_before = 0;
  };
  std::vector<Mark> marks;
  // The thread below posts, and the callbacks may call OpenCL: neither may queue behind a
  // wait of the program's on the server.
  if (!destructors.empty()) tandem::client::NoteHelperThreads();
  for (const auto& [q, stream] : destructors.empty() ? decltype(used_by){} : used_by) {
    if (!Registry<_cl_command_queue>::TryHoldLive(q)) continue;  // gone, and its stream with it
    Mark m{Held<_cl_command_queue>(q), tandem::client::Runtime::Get().NewHandle(), 0};
    q->Unhold();  // TryHoldLive's: m.q holds it now
    if (q->stream != stream) continue;  // another queue at a dead one's address
    m.reads_before = q->ReadsBegun();
    q->session().Post(tandem::ir::MarkerReq{q->stream, 0, {}, m.event});
    q->session().Post(tandem::ir::StreamFlushReq{q->stream});
    marks.push_back(std::move(m));
  }
  auto run = [self, callbacks = std::move(destructors)] {
    for (auto it = callbacks.rbegin(); it != callbacks.rend(); ++it)
      RunCallback([self, cb = *it] { cb.first(self, cb.second); });
  };
  if (marks.empty()) {
    run();
  } else {
    std::thread([marks = std::move(marks), run = std::move(run)] {
      tandem::NameThisThread("tdm-cl-destruct");
      for (const Mark& m : marks) {
        // Polled, not waited for: a wait would hold the session's executor on the server, and
        // with it every later command of the program there, until the marker is done.
        auto pause = std::chrono::microseconds(200);
        for (;;) {
          auto r = CallOn(m.q->session(), tandem::ir::EventQueryReq{m.event});
          if (!r.ok()) {
            tandem::log::Warn("clReleaseMemObject: waiting for the buffer's queued commands: {}; its destructor "
                              "callbacks run now",
                              r.status().message());
            break;
          }
          if (r->status <= tandem::ir::kEventComplete) break;  // done, or failed: nothing more runs
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::microseconds(20000));
        }
        m.q->session().Post(tandem::ir::EventDestroyReq{m.event});
        m.q->WaitForReadsBefore(m.reads_before);
      }
      run();
    }).detach();
  }
  used_by.clear();
  context->Unhold();
}
