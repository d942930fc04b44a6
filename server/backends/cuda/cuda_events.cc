// Streams and events, one to one with the driver's; the `wait` and `signal` fields of every
// enqueue; user events (a pinned host word that streams wait on until UserEventSet).
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "cuda_backend.h"
#include "tandem/log.h"

namespace tandem::server::cuda {
namespace {

constexpr size_t kFlagPage = 4096;
constexpr size_t kWordsPerPage = kFlagPage / sizeof(uint32_t);

// The fallback where stream memory operations are unsupported: a host function that holds
// the stream until the word is set.
void CUDA_CB HoldUntilSet(void* word) {
  while (__atomic_load_n(static_cast<uint32_t*>(word), __ATOMIC_ACQUIRE) == 0) ::usleep(50);
}

void SetWord(uint32_t* word) { __atomic_store_n(word, 1u, __ATOMIC_RELEASE); }

}  // namespace

Result<CudaBackend::Queue> CudaBackend::ResolveStream(uint64_t stream, uint32_t device_of_default) {
  Queue q{device_of_default, nullptr};  // stream 0: the legacy default stream of the device
  if (stream != 0) {
    auto it = streams_.find(stream);
    if (it == streams_.end()) return Status::Unknown(fmt::format("unknown stream {}", stream));
    q = Queue{it->second.device, it->second.stream};
  }
  TANDEM_RETURN_IF_ERROR(Enter(q.device));
  return q;
}

Result<uint32_t> CudaBackend::EventDevice(uint64_t event, const char* what) {
  if (auto it = events_.find(event); it != events_.end()) return it->second.device;
  std::lock_guard<std::mutex> lock(user_mu_);
  auto u = user_events_.find(event);
  if (u == user_events_.end()) return Status::Unknown(fmt::format("{}: unknown event {}", what, event));
  return u->second.device;
}

bool CudaBackend::IsUserEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(user_mu_);
  return user_events_.contains(event);
}

Status CudaBackend::WaitEvents(const Queue& q, const std::vector<uint64_t>& wait) {
  for (uint64_t id : wait) {
    if (auto it = events_.find(id); it != events_.end()) {
      // Events of other devices are fine: the driver orders across contexts.
      TANDEM_RETURN_IF_ERROR(
          Check(q.device, drv_->cuStreamWaitEvent(q.stream, it->second.event, 0), "cuStreamWaitEvent"));
      continue;
    }
    uint32_t* word = nullptr;
    {
      std::lock_guard<std::mutex> lock(user_mu_);
      auto u = user_events_.find(id);
      if (u == user_events_.end()) return Status::Unknown(fmt::format("waits on unknown event {}", id));
      if (u->second.status == UserEvent::kNotSet) word = u->second.word;
    }
    // Set in the meantime or not, the word tells the stream.
    if (word) TANDEM_RETURN_IF_ERROR(WaitUserFlag(q, word));
  }
  return Status::Ok();
}

Result<CUevent> CudaBackend::CheckSignal(const Queue& q, uint64_t signal) {
  if (signal == 0) return CUevent{nullptr};
  auto it = events_.find(signal);
  if (it == events_.end()) {
    if (IsUserEvent(signal))
      return Status::Invalid(fmt::format("event {} is a user event: only UserEventSet completes it", signal));
    return Status::Unknown(fmt::format("signals unknown event {}", signal));
  }
  if (it->second.device != q.device)
    return Status::Invalid(fmt::format("event {} belongs to device {}, the command runs on device {}", signal,
                                       it->second.device, q.device));
  return it->second.event;
}

Status CudaBackend::Signal(const Queue& q, uint64_t signal) {
  auto event = CheckSignal(q, signal);
  if (!event.ok()) return event.status();
  if (signal == 0) return Status::Ok();
  // Recording an event again moves it to this point, as cudaEventRecord does.
  return Check(q.device, drv_->cuEventRecord(event.value(), q.stream), "cuEventRecord");
}

Result<uint32_t*> CudaBackend::NewUserFlag(uint32_t device) {
  UserFlagPages& f = devices_[device].flags;
  if (f.pages.empty() || f.used_in_last == kWordsPerPage) {
    void* p = nullptr;
    TANDEM_RETURN_IF_ERROR(Check(device,
                                 drv_->cuMemHostAlloc(&p, kFlagPage, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
                                 "cuMemHostAlloc"));
    std::memset(p, 0, kFlagPage);
    f.pages.push_back(static_cast<uint32_t*>(p));
    f.used_in_last = 0;
  }
  return f.pages.back() + f.used_in_last++;
}

// Holds the stream until the word becomes non-zero: a stream memory operation where the
// device has them, else a host function that blocks on the word.
Status CudaBackend::WaitUserFlag(const Queue& q, uint32_t* flag) {
  if (drv_->cuStreamWaitValue32) {
    CUdeviceptr word = 0;
    TANDEM_RETURN_IF_ERROR(Check(q.device, drv_->cuMemHostGetDevicePointer(&word, flag, 0), "cuMemHostGetDevicePointer"));
    CUresult r = drv_->cuStreamWaitValue32(q.stream, word, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_ERROR_NOT_SUPPORTED) return Check(q.device, r, "cuStreamWaitValue32");
  }
  return Check(q.device, drv_->cuLaunchHostFunc(q.stream, HoldUntilSet, flag), "cuLaunchHostFunc");
}

// Sets every user-event word of the device, so no stream stays held by one.
void CudaBackend::ReleaseUserFlags(uint32_t device) {
  const UserFlagPages& f = devices_[device].flags;
  for (size_t p = 0; p < f.pages.size(); ++p) {
    const size_t used = p + 1 == f.pages.size() ? f.used_in_last : kWordsPerPage;
    for (size_t w = 0; w < used; ++w) SetWord(f.pages[p] + w);
  }
}

// ---- streams ---------------------------------------------------------------------------------

Status CudaBackend::OnStreamCreate(const ir::StreamCreateReq& req, ir::StreamCreateRep*) {
  if (req.stream == 0) return Status::Invalid("stream handle 0 is the default stream");
  if (streams_.contains(req.stream)) return Status::Invalid(fmt::format("stream {} already exists", req.stream));
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  if (req.flags & ~uint32_t{ir::kStreamNonBlocking})
    return Status::Invalid(fmt::format("stream flags 0x{:x}: CUDA streams take only kStreamNonBlocking", req.flags));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  CUstream s = nullptr;
  const unsigned flags = (req.flags & ir::kStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
  // Out-of-range priorities are clamped by the driver, as cudaStreamCreateWithPriority does.
  TANDEM_RETURN_IF_ERROR(
      Check(device, drv_->cuStreamCreateWithPriority(&s, flags, req.priority), "cuStreamCreateWithPriority"));
  streams_[req.stream] = Stream{device, s};
  return Status::Ok();
}

Status CudaBackend::OnStreamDestroy(const ir::StreamDestroyReq& req, ir::StreamDestroyRep*) {
  auto it = streams_.find(req.stream);
  if (it == streams_.end()) return Status::Unknown(fmt::format("unknown stream {}", req.stream));
  const Stream s = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(s.device));
  streams_.erase(it);
  return Check(s.device, drv_->cuStreamDestroy(s.stream), "cuStreamDestroy");
}

// Stream 0 names no device: it waits for the legacy default stream of every device in use.
Status CudaBackend::OnStreamSync(const ir::StreamSyncReq& req, ir::StreamSyncRep*) {
  if (req.stream != 0) {
    auto q = ResolveStream(req.stream, 0);
    if (!q.ok()) return q.status();
    return Check(q->device, drv_->cuStreamSynchronize(q->stream), "cuStreamSynchronize");
  }
  for (uint32_t d = 0; d < devices_.size(); ++d) {
    if (!devices_[d].ctx) continue;
    TANDEM_RETURN_IF_ERROR(Enter(d));
    TANDEM_RETURN_IF_ERROR(Check(d, drv_->cuStreamSynchronize(nullptr), "cuStreamSynchronize"));
  }
  return Status::Ok();
}

// Waits, then signals. CUDA streams run in order, so every marker is already a barrier.
Status CudaBackend::OnMarker(const ir::MarkerReq& req, ir::MarkerRep*) {
  uint32_t device = 0;
  if (req.stream == 0) {
    // The default stream of the device of the events involved.
    const uint64_t any = req.signal ? req.signal : (req.wait.empty() ? 0 : req.wait.front());
    if (any == 0) return Status::Ok();
    auto d = EventDevice(any, "Marker");
    if (!d.ok()) return d.status();
    device = d.value();
  }
  auto q = ResolveStream(req.stream, device);
  if (!q.ok()) return q.status();
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));
  return Signal(*q, req.signal);
}

// ---- events ----------------------------------------------------------------------------------

Status CudaBackend::OnEventCreate(const ir::EventCreateReq& req, ir::EventCreateRep*) {
  if (req.event == 0) return Status::Invalid("event handle 0 is reserved");
  if (events_.contains(req.event) || IsUserEvent(req.event))
    return Status::Invalid(fmt::format("event {} already exists", req.event));
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  if (req.flags & ~uint32_t{ir::kEventUser | ir::kEventTiming | ir::kEventBlockingSync})
    return Status::Invalid(fmt::format("event flags 0x{:x} are not supported by the CUDA backend", req.flags));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  if (req.flags & ir::kEventUser) {
    auto word = NewUserFlag(device);
    if (!word.ok()) return word.status();
    std::lock_guard<std::mutex> lock(user_mu_);
    user_events_[req.event] = UserEvent{device, word.value()};
    return Status::Ok();
  }
  unsigned flags = CU_EVENT_DEFAULT;
  if (!(req.flags & ir::kEventTiming)) flags |= CU_EVENT_DISABLE_TIMING;
  if (req.flags & ir::kEventBlockingSync) flags |= CU_EVENT_BLOCKING_SYNC;
  CUevent e = nullptr;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuEventCreate(&e, flags), "cuEventCreate"));
  events_[req.event] = Event{device, e};
  return Status::Ok();
}

// A user event destroyed before it was set lets go of the streams it holds.
Status CudaBackend::OnEventDestroy(const ir::EventDestroyReq& req, ir::EventDestroyRep*) {
  auto it = events_.find(req.event);
  if (it == events_.end()) {
    std::lock_guard<std::mutex> lock(user_mu_);
    auto u = user_events_.find(req.event);
    if (u == user_events_.end()) return Status::Unknown(fmt::format("unknown event {}", req.event));
    SetWord(u->second.word);
    user_events_.erase(u);
    return Status::Ok();
  }
  const Event e = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(e.device));
  events_.erase(it);
  return Check(e.device, drv_->cuEventDestroy(e.event), "cuEventDestroy");
}

Status CudaBackend::OnEventQuery(const ir::EventQueryReq& req, ir::EventQueryRep* rep) {
  auto it = events_.find(req.event);
  if (it == events_.end()) {
    std::lock_guard<std::mutex> lock(user_mu_);
    auto u = user_events_.find(req.event);
    if (u == user_events_.end()) return Status::Unknown(fmt::format("unknown event {}", req.event));
    const int32_t st = u->second.status;
    rep->status = st == UserEvent::kNotSet ? ir::kEventSubmitted : std::min(st, 0);
    return Status::Ok();
  }
  const Event& e = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(e.device));
  CUresult r = drv_->cuEventQuery(e.event);
  if (r == CUDA_SUCCESS) {
    rep->status = ir::kEventComplete;
  } else if (r == CUDA_ERROR_NOT_READY) {
    rep->status = ir::kEventRunning;
  } else {
    // The work before the event failed: a negative status carries the driver's code (and
    // Check remembers it when it is sticky, for the commands that follow).
    Check(e.device, r, "cuEventQuery");
    rep->status = -static_cast<int32_t>(r);
  }
  return Status::Ok();
}

// A user event is waited for until UserEventSet, which the receive thread runs meanwhile.
Status CudaBackend::OnEventWait(const ir::EventWaitReq& req, ir::EventWaitRep* rep) {
  for (uint64_t id : req.events) {
    if (auto it = events_.find(id); it != events_.end()) {
      const Event& e = it->second;
      TANDEM_RETURN_IF_ERROR(Enter(e.device));
      TANDEM_RETURN_IF_ERROR(Check(e.device, drv_->cuEventSynchronize(e.event), "cuEventSynchronize"));
      rep->statuses.push_back(ir::kEventComplete);
      continue;
    }
    std::unique_lock<std::mutex> lock(user_mu_);
    if (!user_events_.contains(id)) return Status::Unknown(fmt::format("unknown event {}", id));
    // Only this (the executor's) thread erases user events, so the entry stays while we wait.
    user_cv_.wait(lock, [&] { return user_events_.at(id).status != UserEvent::kNotSet; });
    rep->statuses.push_back(std::min(user_events_.at(id).status, 0));
  }
  return Status::Ok();
}

Status CudaBackend::OnEventElapsed(const ir::EventElapsedReq& req, ir::EventElapsedRep* rep) {
  for (uint64_t id : {req.start, req.end}) {
    if (events_.contains(id)) continue;
    if (IsUserEvent(id)) return Status::Invalid(fmt::format("EventElapsed: user event {} carries no time", id));
    return Status::Unknown(fmt::format("unknown event {}", id));
  }
  const Event& start = events_.at(req.start);
  TANDEM_RETURN_IF_ERROR(Enter(start.device));
  float ms = 0;
  TANDEM_RETURN_IF_ERROR(Check(start.device, drv_->cuEventElapsedTime(&ms, start.event, events_.at(req.end).event),
                               "cuEventElapsedTime"));
  rep->ms = ms;
  return Status::Ok();
}

// Urgent: runs on the worker's receive thread, beside the executor; touches user events only.
Status CudaBackend::OnUserEventSet(const ir::UserEventSetReq& req, ir::UserEventSetRep*) {
  std::lock_guard<std::mutex> lock(user_mu_);
  auto u = user_events_.find(req.event);
  // Unknown, not invalid: a set that overtook its EventCreate (run urgently) is put back in
  // the queue on kUnknownHandle (Session::RunUrgent).
  if (u == user_events_.end()) return Status::Unknown(fmt::format("event {} is not a user event of this session", req.event));
  if (u->second.status != UserEvent::kNotSet)
    return Status::Invalid(fmt::format("user event {} is already set", req.event));
  // A negative (failed) status releases the stream too: the front end reports the failure.
  u->second.status = req.status == UserEvent::kNotSet ? -1 : req.status;
  SetWord(u->second.word);
  user_cv_.notify_all();
  return Status::Ok();
}

}  // namespace tandem::server::cuda
