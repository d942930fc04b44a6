#include "opencl_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <system_error>
#include <thread>

#include "tandem/log.h"

namespace tandem::server::opencl {

const char* ClErrorName(cl_int err) {
  switch (err) {
#define CASE(e) \
  case e:       \
    return #e;
    CASE(CL_SUCCESS) CASE(CL_DEVICE_NOT_FOUND) CASE(CL_DEVICE_NOT_AVAILABLE) CASE(CL_COMPILER_NOT_AVAILABLE)
    CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE) CASE(CL_OUT_OF_RESOURCES) CASE(CL_OUT_OF_HOST_MEMORY)
    CASE(CL_PROFILING_INFO_NOT_AVAILABLE) CASE(CL_MEM_COPY_OVERLAP) CASE(CL_IMAGE_FORMAT_MISMATCH)
    CASE(CL_IMAGE_FORMAT_NOT_SUPPORTED) CASE(CL_BUILD_PROGRAM_FAILURE) CASE(CL_MAP_FAILURE)
    CASE(CL_MISALIGNED_SUB_BUFFER_OFFSET) CASE(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    CASE(CL_COMPILE_PROGRAM_FAILURE) CASE(CL_LINKER_NOT_AVAILABLE) CASE(CL_LINK_PROGRAM_FAILURE)
    CASE(CL_DEVICE_PARTITION_FAILED) CASE(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) CASE(CL_INVALID_VALUE)
    CASE(CL_INVALID_DEVICE_TYPE) CASE(CL_INVALID_PLATFORM) CASE(CL_INVALID_DEVICE) CASE(CL_INVALID_CONTEXT)
    CASE(CL_INVALID_QUEUE_PROPERTIES) CASE(CL_INVALID_COMMAND_QUEUE) CASE(CL_INVALID_HOST_PTR)
    CASE(CL_INVALID_MEM_OBJECT) CASE(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) CASE(CL_INVALID_IMAGE_SIZE)
    CASE(CL_INVALID_SAMPLER) CASE(CL_INVALID_BINARY) CASE(CL_INVALID_BUILD_OPTIONS) CASE(CL_INVALID_PROGRAM)
    CASE(CL_INVALID_PROGRAM_EXECUTABLE) CASE(CL_INVALID_KERNEL_NAME) CASE(CL_INVALID_KERNEL_DEFINITION)
    CASE(CL_INVALID_KERNEL) CASE(CL_INVALID_ARG_INDEX) CASE(CL_INVALID_ARG_VALUE) CASE(CL_INVALID_ARG_SIZE)
    CASE(CL_INVALID_KERNEL_ARGS) CASE(CL_INVALID_WORK_DIMENSION) CASE(CL_INVALID_WORK_GROUP_SIZE)
    CASE(CL_INVALID_WORK_ITEM_SIZE) CASE(CL_INVALID_GLOBAL_OFFSET) CASE(CL_INVALID_EVENT_WAIT_LIST)
    CASE(CL_INVALID_EVENT) CASE(CL_INVALID_OPERATION) CASE(CL_INVALID_GL_OBJECT) CASE(CL_INVALID_BUFFER_SIZE)
    CASE(CL_INVALID_MIP_LEVEL) CASE(CL_INVALID_GLOBAL_WORK_SIZE) CASE(CL_INVALID_PROPERTY)
    CASE(CL_INVALID_IMAGE_DESCRIPTOR) CASE(CL_INVALID_COMPILER_OPTIONS) CASE(CL_INVALID_LINKER_OPTIONS)
    CASE(CL_INVALID_DEVICE_PARTITION_COUNT) CASE(CL_INVALID_PIPE_SIZE) CASE(CL_INVALID_DEVICE_QUEUE)
    CASE(CL_INVALID_SPEC_ID) CASE(CL_MAX_SIZE_RESTRICTION_EXCEEDED) CASE(CL_PLATFORM_NOT_FOUND_KHR)
#undef CASE
    default:
      return "CL_UNKNOWN_ERROR";
  }
}

Status ClError(cl_int err, std::string_view call, std::string_view detail) {
  return Status::Native(Api::kOpenCL, err,
                        detail.empty() ? fmt::format("{} failed: {} ({})", call, ClErrorName(err), err)
                                       : fmt::format("{} failed: {} ({}): {}", call, ClErrorName(err), err, detail));
}

namespace {

// Tandem's own platform must never serve Tandem (a loop through the network).
bool IsTandemPlatform(cl_platform_id p, const std::string& name) {
  std::string suffix;
  QueryString([&](size_t n, void* v, size_t* r) { return clGetPlatformInfo(p, CL_PLATFORM_ICD_SUFFIX_KHR, n, v, r); },
              &suffix);
  return name == "Tandem" || suffix == "TDM";
}

// --devices: comma-separated indices into the list of every usable device, in order.
Result<std::vector<size_t>> ParseFilter(const std::string& filter, size_t count) {
  std::vector<size_t> out;
  if (filter.empty()) {
    for (size_t i = 0; i < count; ++i) out.push_back(i);
    return out;
  }
  size_t start = 0;
  while (start <= filter.size()) {
    size_t end = filter.find(',', start);
    if (end == std::string::npos) end = filter.size();
    std::string_view item(filter.data() + start, end - start);
    size_t index = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), index);
    if (ec != std::errc() || p != item.data() + item.size() || index >= count)
      return Status::Invalid(fmt::format("--devices '{}': '{}' is not a device index below {}", filter, item, count));
    if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
    start = end + 1;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Backend>> Open(const BackendOptions& options) {
  cl_uint num_platforms = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &num_platforms);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && num_platforms == 0))
    return Status(Code::kUnimplemented, "no OpenCL platform is installed (no ICD in /etc/OpenCL/vendors)");
  if (err != CL_SUCCESS) return ClError(err, "clGetPlatformIDs");
  std::vector<cl_platform_id> platforms(num_platforms);
  err = clGetPlatformIDs(num_platforms, platforms.data(), nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetPlatformIDs");

  // Every device of every platform but Tandem's, in platform order.
  std::vector<Device> all;
  std::vector<std::string> platform_names;
  for (cl_platform_id p : platforms) {
    std::string pname;
    err = QueryString([&](size_t n, void* v, size_t* r) { return clGetPlatformInfo(p, CL_PLATFORM_NAME, n, v, r); },
                      &pname);
    if (err != CL_SUCCESS) return ClError(err, "clGetPlatformInfo(CL_PLATFORM_NAME)");
    if (IsTandemPlatform(p, pname)) continue;
    cl_uint n = 0;
    err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n);
    if (err == CL_DEVICE_NOT_FOUND || n == 0) continue;
    if (err != CL_SUCCESS) return ClError(err, "clGetDeviceIDs", pname);
    std::vector<cl_device_id> ids(n);
    err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, ids.data(), nullptr);
    if (err != CL_SUCCESS) return ClError(err, "clGetDeviceIDs", pname);
    for (cl_device_id id : ids) {
      Device d;
      d.platform = p;
      d.id = id;
      d.platform_name = pname;
      err = QueryString([&](size_t sz, void* v, size_t* r) { return clGetDeviceInfo(id, CL_DEVICE_NAME, sz, v, r); },
                        &d.name);
      if (err != CL_SUCCESS) return ClError(err, "clGetDeviceInfo(CL_DEVICE_NAME)");
      all.push_back(std::move(d));
    }
  }
  if (all.empty()) return Status(Code::kUnimplemented, "no OpenCL device (other than Tandem's own)");

  auto chosen = ParseFilter(options.devices, all.size());
  if (!chosen.ok()) return chosen.status();
  std::vector<Device> devices;
  for (size_t i : chosen.value()) {
    Device& d = all[i];
    // One context per device: a session may use devices of different platforms.
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(d.platform), 0};
    cl_context ctx = clCreateContext(props, 1, &d.id, nullptr, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateContext", d.name);
    d.context.reset(ctx);
    if (std::find(platform_names.begin(), platform_names.end(), d.platform_name) == platform_names.end())
      platform_names.push_back(d.platform_name);
    devices.push_back(std::move(d));
  }
  std::string name = "opencl (";
  for (size_t i = 0; i < platform_names.size(); ++i) name += (i ? ", " : "") + platform_names[i];
  name += ")";
  return std::unique_ptr<Backend>(new OpenCLBackend(std::move(devices), std::move(name)));
}

OpenCLBackend::OpenCLBackend(std::vector<Device> devices, std::string name)
    : name_(std::move(name)), devices_(std::move(devices)) {}

OpenCLBackend::~OpenCLBackend() {
  for (cl_event ev : held_markers_) clReleaseEvent(ev);
}

// ---- handles --------------------------------------------------------------------------

Result<Device*> OpenCLBackend::DeviceAt(uint64_t index) {
  if (index >= devices_.size())
    return Status::Invalid(fmt::format("device {} does not exist (this server has {})", index, devices_.size()));
  return &devices_[index];
}

template <class T>
Result<T*> OpenCLBackend::Find(std::unordered_map<uint64_t, T>& table, uint64_t handle, std::string_view kind) {
  auto it = table.find(handle);
  if (it == table.end()) return Status::Unknown(fmt::format("unknown {} handle {:#x}", kind, handle));
  return &it->second;
}

template <class T>
Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, T>& table, uint64_t handle,
                               std::string_view kind) const {
  if (handle == 0) return Status::Invalid(fmt::format("{} handle 0 is reserved", kind));
  if (table.contains(handle)) return Status::Invalid(fmt::format("{} handle {:#x} is already live", kind, handle));
  return Status::Ok();
}

// offset + size inside the buffer, written so that no sum can overflow.
Status OpenCLBackend::CheckRange(const Buffer& b, uint64_t handle, uint64_t offset, uint64_t size) const {
  if (size == 0) return Status::Invalid(fmt::format("zero-byte access to buffer {:#x}", handle));
  if (offset > b.size || size > b.size - offset)
    return Status::Invalid(
        fmt::format("bytes [{}, +{}) are outside buffer {:#x} of {} bytes", offset, size, handle, b.size));
  return Status::Ok();
}

// Explicit instantiations for every table type (the families' files use them).
template Result<Buffer*> OpenCLBackend::Find(std::unordered_map<uint64_t, Buffer>&, uint64_t, std::string_view);
template Result<Module*> OpenCLBackend::Find(std::unordered_map<uint64_t, Module>&, uint64_t, std::string_view);
template Result<Function*> OpenCLBackend::Find(std::unordered_map<uint64_t, Function>&, uint64_t, std::string_view);
template Result<Stream*> OpenCLBackend::Find(std::unordered_map<uint64_t, Stream>&, uint64_t, std::string_view);
template Result<Event*> OpenCLBackend::Find(std::unordered_map<uint64_t, Event>&, uint64_t, std::string_view);
template Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, Buffer>&, uint64_t,
                                        std::string_view) const;
template Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, Module>&, uint64_t,
                                        std::string_view) const;
template Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, Function>&, uint64_t,
                                        std::string_view) const;
template Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, Stream>&, uint64_t,
                                        std::string_view) const;
template Status OpenCLBackend::CheckNew(const std::unordered_map<uint64_t, Event>&, uint64_t,
                                        std::string_view) const;

// ---- queues, wait lists, signals -----------------------------------------------------------

Result<cl_command_queue> OpenCLBackend::DefaultQueue(uint32_t device) {
  Device& d = devices_[device];
  if (!d.default_queue) {
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueueWithProperties(d.context.get(), d.id, props, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties", "default queue");
    d.default_queue = std::make_shared<QueueRef>(q);
  }
  return d.default_queue->get();
}

Status OpenCLBackend::Prepare(uint64_t stream, uint32_t device, const ir::u64s& wait, uint64_t signal, Enqueue* e) {
  prepared_->fetch_add(1, std::memory_order_relaxed);
  e->device = device;
  if (stream == 0) {
    auto q = DefaultQueue(device);
    if (!q.ok()) return q.status();
    e->queue = q.value();
  } else {
    auto s = Find(streams_, stream, "stream");
    if (!s.ok()) return s.status();
    if (s.value()->device != device)
      return Status::Invalid(fmt::format("stream {:#x} is on device {}, the command's objects on device {}", stream,
                                         s.value()->device, device));
    e->queue = s.value()->queue->get();
  }
  // A user event stays the client's to set: it cannot be re-bound to a command.
  if (signal != 0) {
    auto it = events_.find(signal);
    if (it != events_.end() && it->second.user)
      return Status::Invalid(fmt::format("signal {:#x} is a live user event", signal));
  }
  e->signal = signal;
  // OpenCL wait lists must share the queue's context (one per device here). Another device's
  // event that ends by itself (nothing enqueued waits for a user event or gate) is waited for
  // here, on the host, before the command is enqueued: the command is then submitted at once,
  // which NVIDIA's OpenCL does late for one behind a user event. Otherwise it might wait for
  // what only a later command of the session sets (the program's query before it sets a user
  // event) and hold the executor for ever: a stand-in gate in this device's context takes its
  // place, set by the event watcher when the event ends, failed if it fails.
  std::vector<std::pair<uint64_t, cl_event>> same_device;
  for (uint64_t h : wait) {
    auto ev = Find(events_, h, "event");
    if (!ev.ok()) return ev.status();
    cl_event ce = ev.value()->event.get();
    if (!ce) continue;  // never signalled: complete
    if (ev.value()->device == device) {
      same_device.emplace_back(h, ce);
      continue;
    }
    if (EnqueuedCompleteAlone()) {
      cl_int err = clWaitForEvents(1, &ce);
      if (err != CL_SUCCESS) return ClError(err, "clWaitForEvents", fmt::format("event {:#x} of another device", h));
      continue;
    }
    auto stand_in = StandIn(h, ce, device);
    if (!stand_in.ok()) return stand_in.status();
    if (!stand_in.value()) continue;  // complete already
    same_device.emplace_back(h, stand_in.value()->get());
    e->stand_ins.push_back(std::move(stand_in.value()));
  }
  if (same_device.empty()) return Status::Ok();
  // A command enqueued after an event of its wait list failed never runs nor ends on PoCL
  // (3.1 and 5.0: it stays CL_QUEUED, while one enqueued before the failure fails with it;
  // NVIDIA's OpenCL refuses the enqueue; bench/experiments/failed_wait_list.c). Through
  // Tandem that order is not the program's alone: a user event's failure is set from the
  // receive thread and an imported event's when the other server answers, both possibly
  // before the executor reaches a command the program enqueued earlier. Such a command is not
  // enqueued: it fails here, as OpenCL has it fail, and its signal with it. Both failures
  // are set through OnUserEventSet, which takes events_mu_: held from this look to the
  // enqueue call, it keeps them out of the window between. On PoCL 3.1 and 5.0 the commands
  // already waiting on such a user event fail within that same call (failed_wait_list.c), so
  // they are covered too, and so is a server-to-server gate's failure (WriteFromHost sets it
  // under the same lock). Not covered: a failure on the device, which natively races the
  // program's enqueue in the same way.
  e->no_failures = std::unique_lock<std::mutex>(events_mu_);
  for (const auto& [h, ce] : same_device) {
    cl_int status = CL_COMPLETE;
    cl_int err = clGetEventInfo(ce, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
    if (err != CL_SUCCESS) return ClError(err, "clGetEventInfo", fmt::format("event {:#x} of the wait list", h));
    if (status < 0)
      return ClError(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, "enqueue",
                     fmt::format("event {:#x} of the wait list failed (status {}) before the command was enqueued; "
                                 "it does not run",
                                 h, status));
    e->wait.push_back(ce);
  }
  if (after_wait_check_) after_wait_check_();
  return Status::Ok();
}

Result<std::shared_ptr<Gate>> OpenCLBackend::StandIn(uint64_t handle, cl_event event, uint32_t device) {
  cl_int status = CL_COMPLETE;
  cl_int err = clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetEventInfo", fmt::format("event {:#x} of another device", handle));
  if (status == CL_COMPLETE) return std::shared_ptr<Gate>();
  if (status < 0)
    return ClError(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, "enqueue",
                   fmt::format("event {:#x} of another device failed (status {}); the command does not run", handle,
                               status));
  // The watcher only asks about the event: its queue is flushed here (clWaitForEvents did that
  // before), or NVIDIA's OpenCL may never submit what it stands for.
  cl_command_queue q = nullptr;
  if (clGetEventInfo(event, CL_EVENT_COMMAND_QUEUE, sizeof q, &q, nullptr) == CL_SUCCESS && q) clFlush(q);
  err = clRetainEvent(event);  // before the gate: one never set would count as open for good
  if (err != CL_SUCCESS) return ClError(err, "clRetainEvent", fmt::format("event {:#x} of another device", handle));
  auto gate = Gate::Make(devices_[device].context.get(), open_gates_, events_mu_owner_,
                         "a stand-in for another device's event");
  if (!gate.ok()) {
    clReleaseEvent(event);
    return gate.status();
  }
  // A failed event's status is negative; anything else the watcher reports (an event that
  // cannot be asked about) fails the stand-in too.
  EventWatcher::Get().Watch(event, [g = gate.value()](cl_int st) {
    if (st == CL_COMPLETE)
      g->Open();
    else
      g->Fail(st < 0 ? st : CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  });
  return gate;
}

void OpenCLBackend::Complete(Enqueue& e) {
  e.EndFailureCheck();
  if (!e.done) return;
  if (e.signal == 0) {
    clReleaseEvent(e.done);
  } else {
    // Re-signalling an event handle (CUDA's re-record) replaces its previous command.
    std::lock_guard<std::mutex> lock(events_mu_);
    Event& ev = events_[e.signal];
    ev.event.reset(e.done);
    ev.device = e.device;
    ev.user = false;
  }
  e.done = nullptr;
}

// A deferred clFinish's queue: submitted now, unless the wait runs next (Backend::wait_runs_next)
// and its clFinish flushes the queue itself, from the thread that then waits. Through tandemd
// on the H100 that took 2.7 us off a clFinish alone (9 of 10 paired rounds) and 0.8 us off an
// empty kernel + clFinish (7 of 10). A read back keeps its flush: waited for with
// clWaitForEvents, it gained nothing (5 of 10), and natively it was 0.1-0.4 us slower
// unflushed (bench/experiments/opencl_flush_ab.sh, bench/results/2026-11-24-h100-g.md).
void OpenCLBackend::FlushBeforeWait(cl_command_queue q) {
  if (!wait_runs_next()) clFlush(q);
}

Status OpenCLBackend::WaitOnHost(Enqueue& e) {
  e.EndFailureCheck();  // a failure now ends the wait
  if (e.wait.empty()) return Status::Ok();
  cl_int err = clWaitForEvents(e.num_wait(), e.wait_list());
  if (err != CL_SUCCESS) return ClError(err, "clWaitForEvents");
  e.wait.clear();
  return Status::Ok();
}

Status OpenCLBackend::FinishDevice(uint32_t device) {
  std::vector<SharedQueue> queues;
  if (devices_[device].default_queue) queues.push_back(devices_[device].default_queue);
  for (auto& [h, s] : streams_)
    if (s.device == device) queues.push_back(s.queue);
  return FinishLater(std::move(queues));
}

// The wait shares the queues it finishes: a stream destroyed meanwhile keeps its queue until
// then. Run in place (WaitRunsInPlace), it is clFinish, and the first queue's flushes it
// (FlushBeforeWait). Otherwise it may start once later commands are enqueued (the waiter
// busy with an earlier reply, another thread's batch run first), and clFinish would wait for
// them too: for a command held by a user event that the program sets only after this call
// returns, for ever. It then waits for a marker of each queue, which stands for what the queue
// holds now. Failed commands before it are their events' to report, as clFinish leaves them;
// but PoCL fails the marker as soon as one of them fails (a user event set to an error), while
// earlier ones may still run: then clFinish (FinishUnlessEnqueued), exact while nothing was
// enqueued since, else the wait ends early (a documented limit: server/README.md).
Status OpenCLBackend::FinishLater(std::vector<SharedQueue> queues) {
  std::erase(queues, nullptr);  // callers pass only made queues; a null one is not waited for
  const bool in_place = WaitRunsInPlace();
  std::vector<std::shared_ptr<EventRef>> markers;
  for (size_t i = 0; i < queues.size(); ++i) {
    cl_command_queue q = queues[i]->get();
    if (!in_place) {
      cl_event m = nullptr;
      if (cl_int err = clEnqueueMarkerWithWaitList(q, 0, nullptr, &m); err != CL_SUCCESS) {
        if (i > 0) clFlush(queues[0]->get());  // left to a wait that now never runs
        return ClError(err, "clEnqueueMarkerWithWaitList");
      }
      markers.push_back(std::make_shared<EventRef>(m));
      // Held by the backend too: a wait dropped unrun must not release a pending marker.
      if (clRetainEvent(m) == CL_SUCCESS) HoldMarker(m);
    }
    if (i == 0)
      FlushBeforeWait(q);
    else
      clFlush(q);
  }
  if (in_place) {
    DeferredWait wait{[queues = std::move(queues)] {
                        for (const SharedQueue& q : queues) {
                          cl_int err = clFinish(q->get());
                          if (err != CL_SUCCESS) return ClError(err, "clFinish");
                        }
                        return Status::Ok();
                      },
                      nullptr, true};
    return ReplyLater(std::move(wait));
  }
  // Done once every marker is complete, or once the wait has returned: a failed marker's wait
  // may still be in the fallback's clFinish.
  auto returned = std::make_shared<std::atomic<bool>>(false);
  auto done = [markers, returned] {
    return returned->load() || std::ranges::all_of(markers, [](const auto& m) {
             cl_int st = CL_QUEUED;
             return clGetEventInfo(m->get(), CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr) ==
                        CL_SUCCESS &&
                    st == CL_COMPLETE;
           });
  };
  auto wait = [queues = std::move(queues), markers, returned, prepared = prepared_, since = prepared_->load()] {
    Status st = Status::Ok();
    for (size_t i = 0; i < markers.size() && st.ok(); ++i) {
      cl_event e = markers[i]->get();
      cl_int err = clWaitForEvents(1, &e);
      if (err == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        FinishUnlessEnqueued(queues[i], *prepared, since);
      else if (err != CL_SUCCESS)
        st = ClError(err, "clWaitForEvents", "a finish's marker");
    }
    returned->store(true);
    return st;
  };
  return ReplyLater(DeferredWait{std::move(wait), std::move(done)});
}

// clFinish of `q` on a thread of its own, waited for until it returns or the executor
// prepares another command (`prepared` moves past `since`): from then on the clFinish may
// wait for that command too (one held by a user event that the program sets after this
// wait), and this wait ends early instead. The thread ends with its clFinish.
void OpenCLBackend::FinishUnlessEnqueued(const SharedQueue& q, const std::atomic<uint64_t>& prepared,
                                         uint64_t since) {
  if (prepared.load() != since) return;
  auto finished = std::make_shared<std::atomic<bool>>(false);
  try {
    std::thread([q, finished] {
      clFinish(q->get());
      finished->store(true);
    }).detach();
  } catch (const std::system_error& err) {
    log::Warn("a finish whose marker failed early: cannot start a thread ({}); it ends early", err.what());
    return;
  }
  while (!finished->load() && prepared.load() == since) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

Status OpenCLBackend::OnDeviceSync(const ir::DeviceSyncReq& req, ir::DeviceSyncRep*) {
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  return FinishDevice(static_cast<uint32_t>(req.device));
}

}  // namespace tandem::server::opencl

namespace tandem::server {

Result<std::unique_ptr<Backend>> MakeOpenCLBackend(const BackendOptions& options) { return opencl::Open(options); }

}  // namespace tandem::server
