// Streams and events map one to one onto IR streams and events (client-chosen handles, no
// round trip to create). Host callbacks run on a client thread per stream, in stream order:
// the stream waits on a user event that the thread sets once the callback has returned.
#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "frontend.h"
#include "tandem/thread_name.h"

namespace tandem::cuda {

// An event's status as the server reports it (OpenCL-style: 0 complete, > 0 pending,
// < 0 the failure of the command that should have signalled it).
static cudaError_t EventStatusToCuda(int32_t status) {
  if (status == ir::kEventComplete) return cudaSuccess;
  if (status > 0) return cudaErrorNotReady;
  const int32_t code = -status;
  if (code >= ir::kEventFailedTandem && code - ir::kEventFailedTandem <= static_cast<int32_t>(Code::kInternal))
    return ToCuda(Status(static_cast<Code>(code - ir::kEventFailedTandem), "the command failed"));
  return FromCuResult(code);
}

// Runs host callbacks of one stream on its own thread, each once the work queued before it
// has completed. The thread keeps the queue alive until it has drained it.
class CallbackQueue : public std::enable_shared_from_this<CallbackQueue> {
 public:
  struct Item {
    client::Session* session;
    uint64_t done_event;  // signalled when the work before the callback completes
    uint64_t gate_event;  // user event the stream waits on until the callback has run
    std::function<void(cudaError_t)> fn;
    uint64_t copies_before = 0;  // the last asynchronous copy's ticket when it was added
    uint64_t stream = 0;         // its stream's IR handle
  };

  static std::shared_ptr<CallbackQueue> Start() {
    client::NoteHelperThreads();  // it posts, and the program's callbacks may call CUDA
    auto q = std::make_shared<CallbackQueue>();
    std::thread([q] {
      NameThisThread("tdm-callbacks");
      q->Run();
    }).detach();
    return q;
  }

  void Push(Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(item));
    cv_.notify_one();
  }

  // The stream is gone: finish what is queued, then end the thread.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
        if (items_.empty()) return;
        item = std::move(items_.front());
        items_.pop_front();
      }
      cudaError_t status = WaitDone(item);
      // The copies before it in stream order are done on the device; their replies (a read's
      // bytes) may still be on their way, or, under fault tolerance, waiting for every
      // replica's vote. No copy added after it waits here: reads wait for callbacks before
      // they are posted, and a write behind the gate has a later ticket.
      Frontend::Get().WaitPendingThrough(item.copies_before, item.stream);
      item.fn(status);
      item.session->Post(ir::UserEventSetReq{.event = item.gate_event, .status = ir::kEventComplete});
      item.session->Post(ir::EventDestroyReq{.event = item.done_event});
      item.session->Post(ir::EventDestroyReq{.event = item.gate_event});
      item.session->Flush();
      Frontend::Get().EndCallback();
    }
  }

  // Polls the event instead of EventWait: a wait would hold the server's command loop, and
  // with it the UserEventSet of an earlier callback that the event may depend on.
  static cudaError_t WaitDone(const Item& item) {
    auto delay = std::chrono::microseconds(20);
    for (;;) {
      auto rep = item.session->Call(ir::EventQueryReq{.event = item.done_event});
      if (!rep.ok()) return ToCuda(rep.status());
      cudaError_t e = EventStatusToCuda(rep->status);
      if (e != cudaErrorNotReady) return e;
      std::this_thread::sleep_for(delay);
      delay = std::min<std::chrono::microseconds>(delay * 2, std::chrono::milliseconds(1));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stop_ = false;
};

Stream::~Stream() {
  if (callbacks) callbacks->Stop();
}

namespace {

// Callback queues of the default streams, by device.
std::map<int, std::shared_ptr<CallbackQueue>>& DefaultQueues() {
  static auto* queues = new std::map<int, std::shared_ptr<CallbackQueue>>();
  return *queues;
}

bool IsDefault(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }


cudaError_t AddCallback(cudaStream_t stream, std::function<void(cudaError_t)> fn) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(StreamTarget(stream, &d, &s));
  std::shared_ptr<CallbackQueue>& q = IsDefault(stream) ? DefaultQueues()[d->index] : f.streams.at(stream)->callbacks;
  if (!q) q = CallbackQueue::Start();
  std::lock_guard<std::mutex> order(f.post_order);  // the copies it waits for are posted before its gate
  client::Runtime& rt = client::Runtime::Get();
  CallbackQueue::Item item{&d->session(), rt.NewHandle(), rt.NewHandle(), std::move(fn), f.LastPendingTicket(),
                           s.handle};
  client::Session& session = d->session();
  session.Post(ir::EventCreateReq{.event = item.done_event, .device = d->remote(), .flags = 0});
  session.Post(ir::MarkerReq{.stream = s.handle, .barrier = 0, .wait = {}, .signal = item.done_event});
  session.Post(ir::EventCreateReq{.event = item.gate_event, .device = d->remote(), .flags = ir::kEventUser});
  session.Post(ir::MarkerReq{.stream = s.handle, .barrier = 0, .wait = {item.gate_event}, .signal = 0});
  session.Flush();
  f.BeginCallback();
  q->Push(std::move(item));
  return cudaSuccess;
}

// Waits for a stream or event, then for reads landing in host memory, then reports errors.
cudaError_t FinishSync(DeviceContext& d, const Status& st) {
  cudaError_t pending = Frontend::Get().WaitPending();
  cudaError_t async = TakeAsyncErrors(d);
  if (async != cudaSuccess) return async;
  if (!st.ok()) return ToCuda(st);
  return pending;
}

}  // namespace

cudaError_t StreamTarget(cudaStream_t stream, DeviceContext** d, StreamRef* ref) {
  Frontend& f = Frontend::Get();
  TANDEM_RETURN_CUDA_IF_ERROR(ResolveStream(stream, ref));
  return f.Device(ref->device >= 0 ? ref->device : CurrentIndex(), d);
}

cudaError_t ResolveStream(cudaStream_t s, StreamRef* out) {
  if (IsDefault(s)) {
    *out = StreamRef{};
    return cudaSuccess;
  }
  Frontend& f = Frontend::Get();
  auto it = f.streams.find(s);
  if (it == f.streams.end()) return cudaErrorInvalidResourceHandle;
  *out = StreamRef{.handle = it->second->handle, .device = it->second->device};
  return cudaSuccess;
}

}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

// ---- streams ---------------------------------------------------------------------------

namespace {

// The device's stream priority range (least, greatest), asked of its server once; f.mu is let
// go for the round trip.
cudaError_t PriorityRange(std::unique_lock<std::mutex>& lock, DeviceContext* d, int* least, int* greatest) {
  if (!d->priorities) {
    client::Session& s = d->session();
    const uint64_t device = d->remote();
    lock.unlock();
    auto rep = s.Call(ir::PriorityRangeReq{.device = device});
    lock.lock();
    if (!rep.ok()) return ToCuda(rep.status());
    // Greater priorities are lower numbers; a reply that says otherwise is taken as no range.
    d->priorities.emplace(rep->least, std::min(rep->greatest, rep->least));
  }
  *least = d->priorities->first;
  *greatest = d->priorities->second;
  return cudaSuccess;
}

}  // namespace

TANDEM_API cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  int l = 0, g = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(PriorityRange(lock, d, &l, &g)));
  if (least) *least = l;
  if (greatest) *greatest = g;
  return cudaSuccess;
}

// A priority outside the device's range is clamped to it, as CUDA does (cudaStreamGetPriority
// then answers the clamped value); 0, the least priority, needs no range.
TANDEM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (!stream || (flags & ~cudaStreamNonBlocking)) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  if (priority != 0) {
    int least = 0, greatest = 0;
    TANDEM_RETURN_CUDA_IF_ERROR(Return(PriorityRange(lock, d, &least, &greatest)));
    priority = std::clamp(priority, greatest, least);
  }
  auto s = std::make_unique<Stream>();
  s->handle = client::Runtime::Get().NewHandle();
  s->device = d->index;
  s->flags = flags;
  s->priority = priority;
  d->session().Post(ir::StreamCreateReq{.stream = s->handle,
                                        .device = d->remote(),
                                        .flags = (flags & cudaStreamNonBlocking) ? ir::kStreamNonBlocking : 0u,
                                        .priority = priority});
  f.NoteStream(s->handle, flags & cudaStreamNonBlocking);
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  f.streams.emplace(*stream, std::move(s));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

TANDEM_API cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}

// Work already queued still completes (as in CUDA); so do queued host callbacks.
TANDEM_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.streams.find(stream);
  if (it == f.streams.end()) return Return(cudaErrorInvalidResourceHandle);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(it->second->device, &d)));
  DropCapture(stream);  // its capture ends with it, graph and all
  d->session().Post(ir::StreamDestroyReq{.stream = it->second->handle});
  d->foreign_waits.erase(it->second->handle);
  f.ForgetStream(it->second->handle);
  f.streams.erase(it);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;
  StreamRef s;
  uint64_t freed = 0;  // what cudaFreeAsync gave back before this synchronize
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (Capture* c = CaptureOf(stream)) return Return(Invalidate(*c));  // as CUDA: it would wait for nothing
    TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
    if (d->sticky != cudaSuccess) return Return(d->sticky);
    freed = f.freed_async_count;
  }
  // Stream 0 is the legacy default stream, which orders after every blocking stream.
  Status st = f.CallAfterCallbacks(d->session(), ir::StreamSyncReq{.stream = s.handle}).status();
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(f.mu);
    ReleaseFreedAsync(d->index, s.handle, freed);
  }
  return Return(FinishSync(*d, st));
}

// A marker event after the stream's work, queried once.
TANDEM_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;
  StreamRef s;
  const uint64_t probe = client::Runtime::Get().NewHandle();
  uint64_t copies_before = 0;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (Capture* c = CaptureOf(stream)) return Return(Invalidate(*c));
    TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
    if (d->sticky != cudaSuccess) return Return(d->sticky);
    copies_before = f.LastPendingTicket();
    d->session().Post(ir::EventCreateReq{.event = probe, .device = d->remote(), .flags = 0});
    d->session().Post(ir::MarkerReq{.stream = s.handle, .barrier = 0, .wait = {}, .signal = probe});
  }
  auto rep = d->session().Call(ir::EventQueryReq{.event = probe});
  d->session().Post(ir::EventDestroyReq{.event = probe});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  cudaError_t e = EventStatusToCuda(rep->status);
  if (e == cudaErrorNotReady) return e;  // not an error: not recorded as the last error
  f.WaitPendingThrough(copies_before, s.handle);  // its reads have landed, as natively
  if (e == cudaSuccess) e = TakeAsyncErrors(*d);
  return Return(e);
}

TANDEM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags & ~unsigned{cudaEventWaitExternal}) return Return(cudaErrorInvalidValue);  // as natively
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  auto e = f.events.find(event);
  if (e == f.events.end()) return Return(cudaErrorInvalidResourceHandle);
  DeviceContext* d = nullptr;
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
  Event& ev = *e->second;
  // In a capture, only a wait on what the same capture recorded: one stream's nodes form a chain
  // already, so it adds nothing. An event of a capture waited on by another stream would make
  // that stream join the capture: refused.
  if (Capture* c = CaptureOf(stream)) {
    if (!ev.recorded && !ev.capture) return cudaSuccess;  // never recorded: nothing to wait for, as outside
    if (ev.capture != c->id) return Return(Refuse(*c, "cudaStreamWaitEvent on an event recorded outside the capture"));
    return Return(c->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess);
  }
  if (Capture* c = ev.capture ? CaptureById(ev.capture) : nullptr)
    return Return(Refuse(*c, "a second stream joining a capture (cudaStreamWaitEvent)"));
  if (!ev.recorded) return cudaSuccess;  // waiting on a never-recorded event is a no-op
  DeviceContext* ed = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(ev.device, &ed)));
  uint64_t wait = ev.handle;
  if (&ed->session() != &d->session()) {
    // Another server's event: the stream waits on its stand-in there, completed server to
    // server; with direct links off, this thread waits for the event instead.
    wait = ev.imports.On(ed->session(), ev.handle, d->session(), static_cast<uint32_t>(d->remote()));
    auto& waits = d->foreign_waits[s.handle];
    const std::pair<client::Session*, uint64_t> waited{&ed->session(), ev.handle};
    if (std::find(waits.begin(), waits.end(), waited) == waits.end()) waits.push_back(waited);
    if (!wait) {
      client::Session& from = ed->session();
      const uint64_t handle = ev.handle;
      lock.unlock();
      return Return(ToCuda(f.CallAfterCallbacks(from, ir::EventWaitReq{.events = {handle}}).status()));
    }
  }
  d->session().Post(ir::MarkerReq{.stream = s.handle, .barrier = 0, .wait = {wait}, .signal = 0});
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  if (!priority) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.streams.find(stream);
  *priority = it == f.streams.end() ? 0 : it->second->priority;
  return IsDefault(stream) || it != f.streams.end() ? cudaSuccess : Return(cudaErrorInvalidResourceHandle);
}

TANDEM_API cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  if (!flags) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.streams.find(stream);
  *flags = it == f.streams.end() ? cudaStreamDefault : it->second->flags;
  return IsDefault(stream) || it != f.streams.end() ? cudaSuccess : Return(cudaErrorInvalidResourceHandle);
}

TANDEM_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  if (!fn) return Return(cudaErrorInvalidValue);
  if (auto c = Captured(stream, "host", [fn, data](cudaStream_t s) { return cudaLaunchHostFunc(s, fn, data); }))
    return Return(*c);
  return Return(AddCallback(stream, [fn, data](cudaError_t) { fn(data); }));
}

TANDEM_API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void* data,
                                             unsigned int flags) {
  if (!callback || flags != 0) return Return(cudaErrorInvalidValue);
  if (auto c = Captured(stream, "stream callback", nullptr)) return Return(*c);  // CUDA captures none
  return Return(AddCallback(stream, [callback, stream, data](cudaError_t st) { callback(stream, st, data); }));
}

// ---- events -----------------------------------------------------------------------------

TANDEM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
    return Return(cudaErrorInvalidValue);
  if (flags & cudaEventInterprocess) return Unsupported("cudaEventCreateWithFlags(cudaEventInterprocess)");
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  auto e = std::make_unique<Event>();
  e->handle = client::Runtime::Get().NewHandle();
  e->device = d->index;
  e->flags = flags;
  uint32_t ir_flags = (flags & cudaEventDisableTiming) ? 0u : ir::kEventTiming;
  if (flags & cudaEventBlockingSync) ir_flags |= ir::kEventBlockingSync;
  d->session().Post(ir::EventCreateReq{.event = e->handle, .device = d->remote(), .flags = ir_flags});
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  f.events.emplace(*event, std::move(e));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

TANDEM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.events.find(event);
  if (it == f.events.end()) return Return(cudaErrorInvalidResourceHandle);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(it->second->device, &d)));
  d->session().Post(ir::EventDestroyReq{.event = it->second->handle});
  it->second->imports.Drop();
  // Copies must not name it any more.
  for (DeviceContext* dev : f.known())
    for (auto& [stream, waits] : dev->foreign_waits)
      std::erase_if(waits, [&](const auto& w) { return w.second == it->second->handle; });
  f.events.erase(it);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.events.find(event);
  if (it == f.events.end()) return Return(cudaErrorInvalidResourceHandle);
  DeviceContext* d = nullptr;
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
  if (d->index != it->second->device) return Return(cudaErrorInvalidResourceHandle);
  // In a capture, as in CUDA, a record is no node: it marks a point of the capture for waits.
  if (Capture* c = CaptureOf(stream)) {
    if (c->invalidated) return Return(cudaErrorStreamCaptureInvalidated);
    it->second->capture = c->id;
    return cudaSuccess;
  }
  d->session().Post(ir::MarkerReq{.stream = s.handle, .barrier = 0, .wait = {}, .signal = it->second->handle});
  it->second->capture = 0;
  it->second->recorded = true;
  it->second->record_stream = s.handle;
  it->second->copies_before_record = f.LastPendingTicket();
  it->second->imports.Drop();  // they stand for the previous record
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (flags != cudaEventRecordDefault) return Unsupported("cudaEventRecordWithFlags(cudaEventRecordExternal)");
  return cudaEventRecord(event, stream);
}

// The event's handle and device, or why not; `recorded` false means complete already.
static cudaError_t FindEvent(cudaEvent_t event, uint64_t* handle, DeviceContext** d, bool* recorded,
                             unsigned* flags = nullptr, std::pair<uint64_t, uint64_t>* copies_before = nullptr) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.events.find(event);
  if (it == f.events.end()) return cudaErrorInvalidResourceHandle;
  // Recorded in a capture still under way: no record to look at (CUDA prohibits the call in a
  // capture that is not relaxed, invalidating it).
  if (Capture* c = it->second->capture ? CaptureById(it->second->capture) : nullptr)
    return c->mode == cudaStreamCaptureModeRelaxed ? cudaErrorStreamCaptureUnsupported : Invalidate(*c);
  TANDEM_RETURN_CUDA_IF_ERROR(f.Device(it->second->device, d));
  *handle = it->second->handle;
  *recorded = it->second->recorded;
  if (flags) *flags = it->second->flags;
  if (copies_before) *copies_before = {it->second->copies_before_record, it->second->record_stream};
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  uint64_t handle = 0;
  DeviceContext* d = nullptr;
  bool recorded = false;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(FindEvent(event, &handle, &d, &recorded)));
  if (!recorded) return cudaSuccess;
  auto rep = Frontend::Get().CallAfterCallbacks(d->session(), ir::EventWaitReq{.events = {handle}});
  Status st = rep.status();
  cudaError_t e = FinishSync(*d, st);
  if (e == cudaSuccess && rep.ok() && rep->statuses.size() == 1) e = EventStatusToCuda(rep->statuses[0]);
  return Return(e);
}

TANDEM_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  uint64_t handle = 0;
  DeviceContext* d = nullptr;
  bool recorded = false;
  std::pair<uint64_t, uint64_t> copies_before;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(FindEvent(event, &handle, &d, &recorded, nullptr, &copies_before)));
  if (!recorded) return cudaSuccess;
  auto rep = d->session().Call(ir::EventQueryReq{.event = handle});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  cudaError_t e = EventStatusToCuda(rep->status);
  if (e == cudaSuccess) Frontend::Get().WaitPendingThrough(copies_before.first, copies_before.second);
  return e == cudaErrorNotReady ? e : Return(e);
}

TANDEM_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return Return(cudaErrorInvalidValue);
  uint64_t h0 = 0, h1 = 0;
  DeviceContext *d0 = nullptr, *d1 = nullptr;
  bool r0 = false, r1 = false;
  unsigned f0 = 0, f1 = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(FindEvent(start, &h0, &d0, &r0, &f0)));
  TANDEM_RETURN_CUDA_IF_ERROR(Return(FindEvent(end, &h1, &d1, &r1, &f1)));
  if (!r0 || !r1 || d0 != d1 || ((f0 | f1) & cudaEventDisableTiming)) return Return(cudaErrorInvalidResourceHandle);
  auto rep = d0->session().Call(ir::EventElapsedReq{.start = h0, .end = h1});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  *ms = static_cast<float>(rep->ms);
  return cudaSuccess;
}

// ---- stream capture (the rest is in graphs.cc) ------------------------------------------------

// The calling thread's capture interaction mode: exchanged. Tandem is more lenient than CUDA
// in every mode: calls that are unsafe during a global capture (cudaMalloc, a copy on the
// legacy stream) are made, not refused.
TANDEM_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                *mode != cudaStreamCaptureModeRelaxed))
    return Return(cudaErrorInvalidValue);
  thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
  std::swap(current, *mode);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (!device) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
  *device = d->index;
  return cudaSuccess;
}
