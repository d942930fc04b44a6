// Streams (command queues), markers and barriers, and events: user events, status
// queries, waits and profiling times.
#include <fmt/format.h>

#include <algorithm>

#include "opencl_backend.h"
#include "tandem/log.h"

namespace tandem::server::opencl {

Status OpenCLBackend::OnStreamCreate(const ir::StreamCreateReq& req, ir::StreamCreateRep*) {
  TANDEM_RETURN_IF_ERROR(CheckNew(streams_, req.stream, "stream"));
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  constexpr uint32_t kKnown = ir::kStreamProfiling | ir::kStreamOutOfOrder | ir::kStreamNonBlocking;
  if (req.flags & ~kKnown) return Status::Invalid(fmt::format("unknown stream flags {:#x}", req.flags & ~kKnown));
  // kStreamNonBlocking (no implicit sync with stream 0) is what OpenCL queues always are;
  // priority is a CUDA hint that OpenCL queues cannot take without an extension.
  cl_command_queue_properties qp = 0;
  if ((req.flags & ir::kStreamProfiling) || TraceClTimes()) qp |= CL_QUEUE_PROFILING_ENABLE;
  if (req.flags & ir::kStreamOutOfOrder) qp |= CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE;
  cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, qp, 0};
  cl_int err = CL_SUCCESS;
  cl_command_queue q = clCreateCommandQueueWithProperties(d.value()->context.get(), d.value()->id, props, &err);
  if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties");
  streams_[req.stream] = Stream{std::make_shared<QueueRef>(q), static_cast<uint32_t>(req.device)};
  return Status::Ok();
}

Status OpenCLBackend::OnStreamDestroy(const ir::StreamDestroyReq& req, ir::StreamDestroyRep*) {
  auto s = Find(streams_, req.stream, "stream");
  if (!s.ok()) return s.status();
  // What is enqueued on it still completes. Flushed here, as clReleaseCommandQueue would: a
  // wait that still shares the queue (FinishLater) keeps it alive, so dropping this reference
  // may not release it, and a command queued behind a blocked wait must not stay unsubmitted.
  if (cl_int err = clFlush(s.value()->queue->get()); err != CL_SUCCESS)
    log::Warn("stream {:#x}: clFlush before its destroy failed ({}): what it still holds may not run", req.stream,
              ClErrorName(err));
  streams_.erase(req.stream);
  return Status::Ok();
}

// Stream 0 stands for every device's default queue.
Status OpenCLBackend::OnStreamSync(const ir::StreamSyncReq& req, ir::StreamSyncRep*) {
  std::vector<SharedQueue> queues;
  if (req.stream == 0) {
    for (Device& d : devices_)
      if (d.default_queue) queues.push_back(d.default_queue);
  } else {
    auto s = Find(streams_, req.stream, "stream");
    if (!s.ok()) return s.status();
    queues.push_back(s.value()->queue);
  }
  return FinishLater(std::move(queues));
}

Status OpenCLBackend::OnStreamFlush(const ir::StreamFlushReq& req, ir::StreamFlushRep*) {
  if (req.stream == 0) {
    for (Device& d : devices_) {
      if (!d.default_queue) continue;
      cl_int err = clFlush(d.default_queue->get());
      if (err != CL_SUCCESS) return ClError(err, "clFlush", d.name);
    }
    return Status::Ok();
  }
  auto s = Find(streams_, req.stream, "stream");
  if (!s.ok()) return s.status();
  cl_int err = clFlush(s.value()->queue->get());
  return err == CL_SUCCESS ? Status::Ok() : ClError(err, "clFlush");
}

// A marker (or barrier) on stream 0, which names no object, goes to device 0's default queue.
Status OpenCLBackend::OnMarker(const ir::MarkerReq& req, ir::MarkerRep*) {
  uint32_t device = 0;
  if (req.stream != 0) {
    auto s = Find(streams_, req.stream, "stream");
    if (!s.ok()) return s.status();
    device = s.value()->device;
  }
  if (req.barrier > 1) return Status::Invalid(fmt::format("Marker barrier flag {} (0 or 1)", req.barrier));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(req.stream, device, req.wait, req.signal, &e));
  // Its event is asked for and held until it is done (held_markers_).
  cl_int err = req.barrier ? clEnqueueBarrierWithWaitList(e.queue, e.num_wait(), e.wait_list(), e.event_out(true))
                           : clEnqueueMarkerWithWaitList(e.queue, e.num_wait(), e.wait_list(), e.event_out(true));
  if (err != CL_SUCCESS)
    return ClError(err, req.barrier ? "clEnqueueBarrierWithWaitList" : "clEnqueueMarkerWithWaitList");
  cl_event held = e.done;
  if (held && clRetainEvent(held) != CL_SUCCESS) held = nullptr;
  Complete(e);  // ends the failure check (events_mu_) before the held markers are looked at
  if (held) HoldMarker(held);
  return Status::Ok();
}

// Takes over a reference to `marker`, kept until it is no longer pending. The held markers
// that are done (complete or failed) are let go once the list has doubled since the last look,
// so a long run of pending markers costs a constant number of status queries per marker.
void OpenCLBackend::HoldMarker(cl_event marker) {
  held_markers_.push_back(marker);
  if (held_markers_.size() < prune_markers_at_) return;
  std::erase_if(held_markers_, [](cl_event ev) {
    cl_int status = CL_COMPLETE;
    if (clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr) != CL_SUCCESS ||
        status <= CL_COMPLETE) {
      clReleaseEvent(ev);
      return true;
    }
    return false;
  });
  prune_markers_at_ = std::max<size_t>(16, 2 * held_markers_.size());
}

// A user event is a cl_event the client sets; any other event is a name that commands'
// signals bind to later (complete until then, as an unrecorded CUDA event is).
Status OpenCLBackend::OnEventCreate(const ir::EventCreateReq& req, ir::EventCreateRep*) {
  TANDEM_RETURN_IF_ERROR(CheckNew(events_, req.event, "event"));
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  constexpr uint32_t kKnown = ir::kEventUser | ir::kEventTiming | ir::kEventBlockingSync;
  if (req.flags & ~kKnown) return Status::Invalid(fmt::format("unknown event flags {:#x}", req.flags & ~kKnown));
  Event ev;
  ev.device = static_cast<uint32_t>(req.device);
  if (req.flags & ir::kEventUser) {
    cl_int err = CL_SUCCESS;
    cl_event ce = clCreateUserEvent(d.value()->context.get(), &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateUserEvent");
    ev.event.reset(ce);
    ev.user = true;
  }
  if (ev.user) ++user_events_;
  std::lock_guard<std::mutex> lock(events_mu_);
  events_[req.event] = std::move(ev);
  return Status::Ok();
}

Status OpenCLBackend::OnEventDestroy(const ir::EventDestroyReq& req, ir::EventDestroyRep*) {
  auto ev = Find(events_, req.event, "event");
  if (!ev.ok()) return ev.status();
  if (ev.value()->user) --user_events_;
  std::lock_guard<std::mutex> lock(events_mu_);
  events_.erase(req.event);
  return Status::Ok();
}

Status OpenCLBackend::OnEventQuery(const ir::EventQueryReq& req, ir::EventQueryRep* rep) {
  auto ev = Find(events_, req.event, "event");
  if (!ev.ok()) return ev.status();
  cl_event ce = ev.value()->event.get();
  if (!ce) {
    rep->status = CL_COMPLETE;
    return Status::Ok();
  }
  cl_int st = 0;
  cl_int err = clGetEventInfo(ce, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)");
  rep->status = st;
  return Status::Ok();
}

// Waits for each event in turn; a failed command is its (negative) status, not an error.
// The wait runs off the executor (ReplyLater), as a finish does: an event may wait for a user
// event that is set only once a later command of the session has been answered (an event
// query that lets the program's callback run, a call of another thread), or that is failed
// in order by the executor. Where nothing can need the executor, the session runs it in place.
Status OpenCLBackend::OnEventWait(const ir::EventWaitReq& req, ir::EventWaitRep* rep) {
  std::vector<std::shared_ptr<EventRef>> events;  // null: never signalled, complete
  bool first = true;  // the first queue waited on is flushed by its wait if that runs next
  for (uint64_t h : req.events) {
    auto ev = Find(events_, h, "event");
    if (!ev.ok()) return ev.status();
    cl_event ce = ev.value()->event.get();
    if (ce && clRetainEvent(ce) != CL_SUCCESS) return ClError(CL_INVALID_EVENT, "clRetainEvent", fmt::format("event {:#x}", h));
    events.push_back(ce ? std::make_shared<EventRef>(ce) : nullptr);
    // Every queue is flushed, but the first one's when its wait runs next (FlushBeforeWait,
    // as FinishLater): the waiter may block on one event while another's queue, which it
    // waits for, would otherwise stay unsubmitted.
    cl_command_queue q = nullptr;
    if (ce && clGetEventInfo(ce, CL_EVENT_COMMAND_QUEUE, sizeof q, &q, nullptr) == CL_SUCCESS && q) {
      if (first)
        FlushBeforeWait(q);
      else
        clFlush(q);
      first = false;
    }
  }
  auto ended = [events] { return std::ranges::all_of(events, [](const auto& ev) { return !ev || Ended(ev->get()); }); };
  return ReplyLater([events = std::move(events), rep] {
    for (const auto& ev : events) {
      if (!ev) {
        rep->statuses.push_back(CL_COMPLETE);
        continue;
      }
      cl_event ce = ev->get();
      cl_int err = clWaitForEvents(1, &ce);
      if (err != CL_SUCCESS && err != CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        return ClError(err, "clWaitForEvents");
      cl_int st = 0;
      err = clGetEventInfo(ce, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, nullptr);
      if (err != CL_SUCCESS) return ClError(err, "clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)");
      rep->statuses.push_back(st);
    }
    return Status::Ok();
  }, std::move(ended));
}

bool Ended(cl_event event) {
  cl_int st = CL_QUEUED;
  return clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr) != CL_SUCCESS ||
         st <= CL_COMPLETE;
}

Status OpenCLBackend::OnEventTimes(const ir::EventTimesReq& req, ir::EventTimesRep* rep) {
  auto ev = Find(events_, req.event, "event");
  if (!ev.ok()) return ev.status();
  cl_event ce = ev.value()->event.get();
  if (!ce) return ClError(CL_PROFILING_INFO_NOT_AVAILABLE, "clGetEventProfilingInfo", "the event was never signalled");
  const std::pair<cl_profiling_info, uint64_t*> times[] = {{CL_PROFILING_COMMAND_QUEUED, &rep->queued},
                                                           {CL_PROFILING_COMMAND_SUBMIT, &rep->submit},
                                                           {CL_PROFILING_COMMAND_START, &rep->start},
                                                           {CL_PROFILING_COMMAND_END, &rep->end}};
  // The client asks once it knows the command is done (a read's bytes have landed), but the
  // driver may not have noted the event's completion yet: NVIDIA's then answers
  // CL_PROFILING_INFO_NOT_AVAILABLE (seen about once in 150 GPU runs of events_profiling, never
  // in a native loop that waits on the event first). Waiting on the event notes it; it is done
  // or about to be, so the wait is short.
  for (int attempt = 0;; ++attempt) {
    cl_int err = CL_SUCCESS;
    for (auto [param, out] : times) {
      cl_ulong t = 0;
      if ((err = clGetEventProfilingInfo(ce, param, sizeof(t), &t, nullptr)) != CL_SUCCESS) break;
      *out = t;
    }
    if (err == CL_SUCCESS) return Status::Ok();
    if (err != CL_PROFILING_INFO_NOT_AVAILABLE || attempt > 0) return ClError(err, "clGetEventProfilingInfo");
    if ((err = clWaitForEvents(1, &ce)) != CL_SUCCESS) return ClError(err, "clWaitForEvents (for its times)");
  }
}

// The source end of a cross-server event wait: the watcher reports when the event is done.
Status OpenCLBackend::NotifyWhenDone(uint64_t event, std::function<void(int32_t status)> done) {
  cl_event ce = nullptr;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    auto ev = Find(events_, event, "event");
    if (!ev.ok()) return ev.status();
    ce = ev.value()->event.get();
    if (ce) clRetainEvent(ce);
  }
  if (!ce) {
    done(CL_COMPLETE);  // never signalled: complete
    return Status::Ok();
  }
  EventWatcher::Get().Watch(ce, std::move(done));
  return Status::Ok();
}

Status OpenCLBackend::OnUserEventSet(const ir::UserEventSetReq& req, ir::UserEventSetRep*) {
  std::lock_guard<std::mutex> lock(events_mu_);
  auto ev = Find(events_, req.event, "event");
  if (!ev.ok()) return ev.status();
  if (!ev.value()->user) return Status::Invalid(fmt::format("event {:#x} is not a user event", req.event));
  if (req.status > 0)
    return Status::Invalid(fmt::format("user event status {} (CL_COMPLETE or a negative error)", req.status));
  cl_int err = clSetUserEventStatus(ev.value()->event.get(), req.status);
  return err == CL_SUCCESS ? Status::Ok() : ClError(err, "clSetUserEventStatus");
}

}  // namespace tandem::server::opencl
