// Events: the remote event a command signals, its status cached on the client once it is
// final, waits (EventWait for all of one server's events at once), profiling (EventTimes,
// cached), user events, callbacks (run in order on a thread of this library) and the
// routing of the servers' deferred errors to the events they concern.
#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <unordered_set>
#include <thread>

#include "objects.h"
#include "tandem/thread_name.h"

namespace tandem::ocl {
namespace {

// Remote event handle -> event, for routing asynchronous errors.
struct HandleMap {
  std::mutex mu;
  std::unordered_map<uint64_t, cl_event> events;
};
HandleMap& Handles() {
  static HandleMap* m = new HandleMap;
  return *m;
}

// The streams (queues) with a failure of a command that changed device memory and had no
// event of the program's to carry it, until the queue's next clFinish or blocking read.
struct UnclaimedFailures {
  std::mutex mu;
  std::unordered_set<uint64_t> live;     // the streams of queues not yet released
  std::unordered_set<uint64_t> streams;  // those with a failure to report
};
UnclaimedFailures& Unclaimed() {
  static UnclaimedFailures* u = new UnclaimedFailures;
  return *u;
}

// The event for a handle, held, or null when it is gone.
Held<_cl_event> FindEvent(uint64_t handle) {
  HandleMap& m = Handles();
  std::lock_guard lock(m.mu);
  auto it = m.events.find(handle);
  if (it == m.events.end() || !it->second->TryHold()) return {};
  Held<_cl_event> held(it->second);
  it->second->Unhold();  // Held took its own hold
  return held;
}

// One thread runs every application callback, in the order they became due, never on
// the receiver thread (callbacks may call OpenCL and wait).
class CallbackThread {
 public:
  void Run(std::function<void()> fn) {
    std::lock_guard lock(mu_);
    if (!started_) {
      std::thread([this] {
        tandem::NameThisThread("tdm-cl-callback");
        Loop();
      }).detach();
      started_ = true;
    }
    queue_.push_back(std::move(fn));
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool started_ = false;
};

// Watches remote events that have callbacks pending: polls them with EventQuery (answered
// at once, so the server's session never blocks on an event that waits for a user event
// the application has still to set), backing off from 1 ms to 50 ms while nothing changes.
class Watcher {
 public:
  void Add(cl_event e) {
    std::lock_guard lock(mu_);
    if (!started_) {
      std::thread([this] {
        tandem::NameThisThread("tdm-cl-watch");
        Loop();
      }).detach();
      started_ = true;
    }
    watched_.emplace_back(e);
    fresh_ = true;
    cv_.notify_one();
  }

 private:
  void Loop() {
    auto delay = std::chrono::milliseconds(1);
    for (;;) {
      std::vector<Held<_cl_event>> list;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return !watched_.empty(); });
        std::erase_if(watched_, [](const Held<_cl_event>& e) {
          std::lock_guard elock(e->mu);
          return e->status <= CL_COMPLETE;
        });
        list = watched_;
        if (fresh_) delay = std::chrono::milliseconds(1);
        fresh_ = false;
      }
      std::vector<client::Session*> sessions;
      for (auto& e : list) {
        {
          std::lock_guard elock(e->mu);
          if (e->watching) continue;  // the previous query is still out
          e->watching = true;
        }
        client::Session& s = e->session();
        s.Post(ir::EventQueryReq{e->handle}, [e](const Status& st, ir::EventQueryRep&& rep) {
          {
            std::lock_guard elock(e->mu);
            e->watching = false;
          }
          SetEventStatus(e.get(), st.ok() ? rep.status : ToCl(st, "clSetEventCallback", CL_INVALID_EVENT));
        });
        if (std::find(sessions.begin(), sessions.end(), &s) == sessions.end()) sessions.push_back(&s);
      }
      for (client::Session* s : sessions) s->Flush();
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, delay, [this] { return fresh_; });
      delay = std::min(delay * 2, std::chrono::milliseconds(50));
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held<_cl_event>> watched_;
  bool fresh_ = false;
  bool started_ = false;
};

// Current status, asking the server (EventQuery) only while a remote event is pending.
cl_int QueryStatus(cl_event e) {
  {
    std::lock_guard lock(e->mu);
    if (e->status <= CL_COMPLETE || e->completion != _cl_event::Completion::kRemote) return e->status;
  }
  auto r = CallOn(e->session(), ir::EventQueryReq{e->handle});
  if (!r.ok()) {
    SetEventStatus(e, ToCl(r.status(), "clGetEventInfo", CL_INVALID_EVENT));
  } else {
    SetEventStatus(e, r->status);
  }
  std::lock_guard lock(e->mu);
  return e->status;
}

}  // namespace

void RunCallback(std::function<void()> fn) {
  static CallbackThread* thread = new CallbackThread;  // lives until exit
  thread->Run(std::move(fn));
}

cl_event NewEvent(cl_context context, cl_command_queue queue, cl_command_type type,
                  _cl_event::Completion completion) {
  auto e = std::make_unique<_cl_event>();
  e->context = context;
  e->queue = queue;
  e->type = type;
  e->completion = completion;
  e->handle = client::Runtime::Get().NewHandle();
  context->Hold();
  if (queue) queue->Hold();
  cl_event ev = Publish(e.release());
  HandleMap& m = Handles();
  std::lock_guard lock(m.mu);
  m.events[ev->handle] = ev;
  return ev;
}

void SetEventStatus(cl_event e, cl_int status) {
  // A failure without an OpenCL code (ir::kEventFailedTandem + Code) gets the nearest one.
  if (status <= -ir::kEventFailedTandem)
    status = ToCl(Status(static_cast<Code>(-status - ir::kEventFailedTandem), "the command failed"), "event",
                  CL_OUT_OF_RESOURCES);
  std::vector<_cl_event::Callback> due;
  {
    std::lock_guard lock(e->mu);
    if (e->status <= CL_COMPLETE || status >= e->status) return;
    e->status = status;
    auto keep = e->callbacks.begin();
    for (auto& cb : e->callbacks) {
      if (status <= cb.type) {
        due.push_back(cb);
      } else {
        *keep++ = cb;
      }
    }
    e->callbacks.erase(keep, e->callbacks.end());
    if (status <= CL_COMPLETE) e->cv.notify_all();
  }
  for (const auto& cb : due) {
    cl_int reported = status < 0 ? status : cb.type;
    RunCallback([held = Held<_cl_event>(e), cb, reported] { cb.fn(held.get(), reported, cb.data); });
  }
}

namespace {
// The stand-in on q's server of e, an event of another server (a command's, or a user event,
// which lives on the context's home server), made on first use; 0 when it cannot be: direct
// links are off, or e completes only once a reply reached this process.
uint64_t ImportedTo(cl_event e, cl_command_queue q) {
  if (e->completion == _cl_event::Completion::kHost || !e->bound) return 0;
  std::lock_guard lock(e->mu);
  return e->imports.On(e->session(), e->handle, q->session(), q->device->remote->remote_index);
}
}  // namespace

std::vector<uint64_t> HandlesOn(const std::vector<cl_event>& foreign, const client::Session* session) {
  std::vector<uint64_t> out;
  for (cl_event e : foreign)
    if (&e->session() == session) out.push_back(e->handle);
  return out;
}

cl_int CheckWaitList(cl_command_queue q, cl_uint n, const cl_event* list, std::vector<uint64_t>* handles,
                     std::vector<cl_event>* foreign) {
  if ((n > 0) != (list != nullptr)) return CL_INVALID_EVENT_WAIT_LIST;
  client::Session& home = q->session();
  for (cl_uint i = 0; i < n; ++i) {
    cl_event e = list[i];
    if (!Valid(e)) return CL_INVALID_EVENT_WAIT_LIST;
    if (e->context != q->context) return CL_INVALID_CONTEXT;
    {
      std::lock_guard lock(e->mu);
      if (e->status == CL_COMPLETE) continue;
    }
    if (&e->session() != &home) {
      if (uint64_t stand_in = ImportedTo(e, q)) {
        handles->push_back(stand_in);
        foreign->push_back(e);
        continue;
      }
      WarnOnce("OpenCL: waiting on the client for an event of another server (direct links are off)");
      WaitEvents({e});
      continue;
    }
    handles->push_back(e->handle);
  }
  return CL_SUCCESS;
}

cl_int WaitEvents(const std::vector<cl_event>& events) {
  std::vector<Held<_cl_event>> held(events.begin(), events.end());
  std::map<client::Session*, std::vector<cl_event>> remote;
  for (cl_event e : events) {
    std::unique_lock lock(e->mu);
    if (e->status <= CL_COMPLETE) continue;
    if (e->completion == _cl_event::Completion::kRemote) {
      remote[&e->session()].push_back(e);
    } else {
      // Completed by a reply callback or by clSetUserEventStatus.
      lock.unlock();
      client::Runtime::Get().FlushAll();
      lock.lock();
      e->cv.wait(lock, [e] { return e->status <= CL_COMPLETE; });
    }
  }
  // One EventWait per server for all of its events.
  for (auto& [session, list] : remote) {
    ir::EventWaitReq req;
    for (cl_event e : list) req.events.push_back(e->handle);
    auto r = CallOn(*session, req);
    for (size_t i = 0; i < list.size(); ++i) {
      if (!r.ok()) {
        SetEventStatus(list[i], ToCl(r.status(), "clWaitForEvents", CL_INVALID_EVENT));
      } else {
        SetEventStatus(list[i], i < r->statuses.size() ? r->statuses[i] : CL_OUT_OF_RESOURCES);
      }
    }
  }
  for (cl_event e : events) {
    std::lock_guard lock(e->mu);
    if (e->status < 0) return CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
  }
  return CL_SUCCESS;
}

// Taken and noted for their queues as one step: a thread whose clFinish or blocking read came
// after these errors (its reply arrived after theirs, or carried them for an earlier reply
// that has not come) routes, then asks for its queue's failure (TakeUnclaimedFailure), and
// must not do so while another thread holds them between the two. Event callbacks run on
// their own thread (RunCallback), so none runs under the lock.
void RouteAsyncErrors(client::Session& s) {
  static std::mutex* route_mu = new std::mutex;
  std::lock_guard route(*route_mu);
  for (const ir::AsyncError& err : s.TakeAsyncErrors()) {
    Status st(static_cast<Code>(err.code), err.message, err.native, static_cast<Api>(err.api));
    std::string_view command = ir::CommandName(static_cast<uint16_t>(err.opcode));
    bool told = false;  // an event of the program's carries it
    if (err.signal) {
      if (Held<_cl_event> e = FindEvent(err.signal)) {
        cl_int code = ToCl(st, command, CL_INVALID_EVENT);
        SetEventStatus(e.get(), code < 0 ? code : CL_OUT_OF_RESOURCES);
        told = !e->internal;
      }
    }
    if (told) continue;
    // Nothing tells the program: a command that wrote device memory and failed itself (not
    // for a failed event it waited on, which the program knows of, as PoCL and NVIDIA leave
    // to the events) is reported by its queue's next clFinish or blocking read, since the
    // device's contents are not what the program asked for; anything else (a release, a
    // flush) only here.
    const ir::CommandInfo* info = ir::FindCommand(static_cast<uint16_t>(err.opcode));
    const bool waited =
        err.waited || (st.api() == Api::kOpenCL && st.native() == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    const bool report = info && (info->flags & ir::kWritesDevice) && !waited && err.stream != 0;
    log::Error("OpenCL: asynchronous {} on {} failed: {}{}", command, s.server(), st.ToString(),
               report ? " (reported by its queue's next clFinish or blocking read)" : "");
    if (report) {
      UnclaimedFailures& u = Unclaimed();
      std::lock_guard lock(u.mu);
      if (u.live.contains(err.stream)) u.streams.insert(err.stream);  // a released queue's is only logged
    }
  }
}

cl_int TakeUnclaimedFailure(cl_command_queue q) {
  UnclaimedFailures& u = Unclaimed();
  std::lock_guard lock(u.mu);
  return u.streams.erase(q->stream) ? CL_OUT_OF_RESOURCES : CL_SUCCESS;
}

void NoteQueueStream(uint64_t stream) {
  UnclaimedFailures& u = Unclaimed();
  std::lock_guard lock(u.mu);
  u.live.insert(stream);
}

void ForgetQueueStream(uint64_t stream) {
  UnclaimedFailures& u = Unclaimed();
  std::lock_guard lock(u.mu);
  u.live.erase(stream);
  u.streams.erase(stream);
}

// ---- entry points ----------------------------------------------------------------------------

cl_int WaitForEvents(cl_uint n, const cl_event* list) {
  if (n == 0 || !list) return CL_INVALID_VALUE;
  std::vector<cl_event> events;
  for (cl_uint i = 0; i < n; ++i) {
    if (!Valid(list[i])) return CL_INVALID_EVENT;
    if (list[i]->context != list[0]->context) return CL_INVALID_CONTEXT;
    events.push_back(list[i]);
  }
  return WaitEvents(events);
}

cl_int GetEventInfo(cl_event e, cl_event_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  switch (param) {
    case CL_EVENT_COMMAND_QUEUE:
      return AnswerValue(size, value, size_ret, e->queue);
    case CL_EVENT_CONTEXT:
      return AnswerValue(size, value, size_ret, e->context);
    case CL_EVENT_COMMAND_TYPE:
      return AnswerValue(size, value, size_ret, e->type);
    case CL_EVENT_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, e->refs.load());
    case CL_EVENT_COMMAND_EXECUTION_STATUS: {
      if (value && size < sizeof(cl_int)) return CL_INVALID_VALUE;
      return AnswerValue(size, value, size_ret, QueryStatus(e));
    }
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int RetainEvent(cl_event e) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  e->Retain();
  return CL_SUCCESS;
}

cl_int ReleaseEvent(cl_event e) {
  if (!Valid(e) || !e->Release()) return CL_INVALID_EVENT;
  return CL_SUCCESS;
}

cl_int GetEventProfilingInfo(cl_event e, cl_profiling_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  if (!e->queue || !e->queue->profiling()) return CL_PROFILING_INFO_NOT_AVAILABLE;
  int index;
  switch (param) {
    case CL_PROFILING_COMMAND_QUEUED: index = 0; break;
    case CL_PROFILING_COMMAND_SUBMIT: index = 1; break;
    case CL_PROFILING_COMMAND_START: index = 2; break;
    case CL_PROFILING_COMMAND_END: index = 3; break;
    default: return CL_INVALID_VALUE;
  }
  if (QueryStatus(e) != CL_COMPLETE) return CL_PROFILING_INFO_NOT_AVAILABLE;
  std::optional<std::array<cl_ulong, 4>> times;
  {
    std::lock_guard lock(e->mu);
    times = e->times;
  }
  if (!times) {
    auto r = CallOn(e->session(), ir::EventTimesReq{e->handle});
    if (!r.ok()) return ToCl(r.status(), "clGetEventProfilingInfo", CL_PROFILING_INFO_NOT_AVAILABLE);
    times = std::array<cl_ulong, 4>{r->queued, r->submit, r->start, r->end};
    std::lock_guard lock(e->mu);
    e->times = times;
  }
  return AnswerValue(size, value, size_ret, (*times)[index]);
}

// Runs fn once the event reaches `type` (or fails): at once on the callback thread when it
// already has; otherwise when the watcher's polls, a wait or the local completion set the
// status.
cl_int SetEventCallback(cl_event e, cl_int type, void(CL_CALLBACK* fn)(cl_event, cl_int, void*), void* data) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  if (!fn || (type != CL_COMPLETE && type != CL_RUNNING && type != CL_SUBMITTED)) return CL_INVALID_VALUE;
  // The watcher posts from its own thread, and the callback, on another, may call OpenCL:
  // neither may queue behind a wait of the program's on the server.
  client::NoteHelperThreads();
  client::Session& s = e->session();
  // Once flushed, a command is submitted: that is all a CL_SUBMITTED callback waits for.
  if (type == CL_SUBMITTED && e->completion != _cl_event::Completion::kUser) s.Flush();
  bool watch = false;
  {
    std::lock_guard lock(e->mu);
    bool reached = e->status <= type || (type == CL_SUBMITTED && e->completion != _cl_event::Completion::kUser);
    if (reached) {
      cl_int reported = e->status < 0 ? e->status : type;
      RunCallback([held = Held<_cl_event>(e), fn, data, reported] { fn(held.get(), reported, data); });
      return CL_SUCCESS;
    }
    e->callbacks.push_back({type, fn, data});
    watch = e->completion == _cl_event::Completion::kRemote;
  }
  if (watch) {
    static Watcher* watcher = new Watcher;  // lives until exit
    watcher->Add(e);
  }
  return CL_SUCCESS;
}

cl_event CreateUserEvent(cl_context context, cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  cl_event e = NewEvent(context, nullptr, CL_COMMAND_USER, _cl_event::Completion::kUser);
  e->status = CL_SUBMITTED;
  e->bound = true;
  e->session().Post(ir::EventCreateReq{e->handle, context->home()->remote->remote_index, ir::kEventUser});
  SetErr(errcode_ret, CL_SUCCESS);
  return e;
}

cl_int SetUserEventStatus(cl_event e, cl_int status) {
  if (!Valid(e) || e->completion != _cl_event::Completion::kUser) return CL_INVALID_EVENT;
  if (status > CL_COMPLETE) return CL_INVALID_VALUE;
  {
    std::lock_guard lock(e->mu);
    if (e->status <= CL_COMPLETE) return CL_INVALID_OPERATION;
  }
  client::Session& s = e->session();
  s.Post(ir::UserEventSetReq{e->handle, status});
  Status st = s.Flush();
  SetEventStatus(e, status);
  return ToCl(st, "clSetUserEventStatus");
}

}  // namespace tandem::ocl

// ---- object members (the objects live in the global namespace, as cl.h declares them) ----

using namespace tandem::ocl;  // NOLINT: member bodies call the family helpers

tandem::client::Session& _cl_event::session() const {
  return queue ? queue->session() : context->home()->session();
}

_cl_event::~_cl_event() {
  {
    HandleMap& m = Handles();
    std::lock_guard lock(m.mu);
    m.events.erase(handle);
  }
  if (bound) session().Post(tandem::ir::EventDestroyReq{handle});
  imports.Drop();
  if (queue) queue->Unhold();
  context->Unhold();
}
