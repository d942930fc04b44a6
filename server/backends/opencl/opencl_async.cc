// Work that finishes off the executor: the event watcher (a thread that sees OpenCL events
// complete and runs what waits for them) and the asynchronous halves of server-to-server
// copies: ReadToHost, a non-blocking read in stream order; WriteFromHost, a copy in stream
// order from a device buffer of its own that a blocking write on the watcher's thread fills
// (an implementation may read a non-blocking write's host memory at any time).
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "opencl_backend.h"
#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::server::opencl {
namespace {

using Clock = std::chrono::steady_clock;

// Host memory the implementation can reach by DMA (CL_MEM_ALLOC_HOST_PTR: pinned on NVIDIA's),
// kept mapped for its whole life, with a queue of its own for the map and the unmap.
class MappedHostBuffer final : public HostBuffer {
 public:
  MappedHostBuffer(QueueRef queue, MemRef mem, uint8_t* p, size_t n, std::string what)
      : queue_(std::move(queue)), mem_(std::move(mem)), p_(p), size_(n), what_(std::move(what)) {}
  ~MappedHostBuffer() override {
    cl_int err = clEnqueueUnmapMemObject(queue_.get(), mem_.get(), p_, 0, nullptr, nullptr);
    if (err == CL_SUCCESS) err = clFinish(queue_.get());
    if (err != CL_SUCCESS) log::Warn("{}: unmapping it failed ({})", what_, ClErrorName(err));
  }
  uint8_t* data() override { return p_; }
  size_t size() const override { return size_; }

 private:
  QueueRef queue_;
  MemRef mem_;
  uint8_t* p_;
  size_t size_;
  std::string what_;
};

}  // namespace

cl_int FailedStatus(const Status& st) {
  if (st.api() == Api::kOpenCL && st.native() < 0) return st.native();
  return -(ir::kEventFailedTandem + static_cast<cl_int>(st.code()));
}

EventWatcher& EventWatcher::Get() {
  static EventWatcher* w = new EventWatcher;  // its threads outlive every backend
  return *w;
}

namespace {
void CL_CALLBACK WatchCallback(cl_event, cl_int status, void* data) {
  std::unique_ptr<std::shared_ptr<EventWatcher::Pending>> p(static_cast<std::shared_ptr<EventWatcher::Pending>*>(data));
  EventWatcher::Get().Fire(*p, status, EventWatcher::kCallback);
}
}  // namespace

void EventWatcher::Watch(cl_event event, std::function<void(cl_int status)> fn) {
  auto p = std::make_shared<Pending>();
  p->event = event;
  p->fn = std::move(fn);
  p->since = Clock::now();
  // The poller alone would do, but callbacks are prompt whatever the event's age. (It may run
  // at once; the poller then skips the fired watch.)
  auto data = std::make_unique<std::shared_ptr<Pending>>(p);
  if (clSetEventCallback(event, CL_COMPLETE, WatchCallback, data.get()) == CL_SUCCESS) data.release();
  Start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void EventWatcher::Post(std::function<void()> fn) {
  Start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(Ready{[fn = std::move(fn)](cl_int) { fn(); }, CL_COMPLETE, nullptr,
                           profile_ ? Clock::now() : Clock::time_point{}});
  }
  run_cv_.notify_one();
}

void EventWatcher::Start() {
  std::call_once(started_, [this] {
    std::thread([this] { NameThisThread("tdm-cl-poll"); PollLoop(); }).detach();
    std::thread([this] { NameThisThread("tdm-cl-run"); RunLoop(); }).detach();
  });
}

void EventWatcher::Fire(const std::shared_ptr<Pending>& p, cl_int status, Via via) {
  if (p->fired.exchange(true)) return;
  Clock::time_point now{};
  if (profile_) {
    static constexpr const char* kVia[] = {"watcher: fired by callback", "watcher: fired by young poll",
                                           "watcher: fired by sweep"};
    now = Clock::now();
    profile_->Add(kVia[via], now - p->since);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(Ready{std::move(p->fn), status, p, now});
  }
  run_cv_.notify_one();
}

// Polls pending events beside the callbacks: continuously those younger than kEager (a
// transfer or a dependency due any moment), the others every kSlow. PoCL never calls back for
// an event failed by its wait list, and NVIDIA's callbacks came 20-40 us after a poll saw the
// event (H100, driver 580). The queries run without the lock: a program that enqueued far
// ahead leaves hundreds of events pending, and callbacks and the runner must not wait for a
// sweep. A callback's data is leaked when the implementation never calls it (a failed event on
// PoCL): a few bytes and the event.
void EventWatcher::PollLoop() {
  constexpr auto kEager = std::chrono::milliseconds(2);
  constexpr auto kSlow = std::chrono::milliseconds(5);
  auto last_sweep = Clock::now();
  for (;;) {
    std::vector<std::shared_ptr<Pending>> snapshot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !watches_.empty(); });
      std::erase_if(watches_, [](const std::shared_ptr<Pending>& p) { return p->fired.load(); });
      snapshot = watches_;
    }
    const auto now = Clock::now();
    const bool sweep = now - last_sweep >= kSlow;
    if (sweep) last_sweep = now;
    bool eager = false;
    for (const auto& p : snapshot) {
      const bool young = now - p->since < kEager;
      eager |= young;
      if (p->fired || !(young || sweep)) continue;
      cl_int st = CL_QUEUED;
      cl_int err = clGetEventInfo(p->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
      if (err != CL_SUCCESS) st = err;  // an event that cannot be asked about has failed
      if (st <= CL_COMPLETE) Fire(p, st, young ? kYoungPoll : kSweep);
    }
    if (eager) {
      std::this_thread::yield();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
}

// Runs what waited for the events, in the order they completed, off the poller so a slow one
// (a blocking copy) delays no poll.
void EventWatcher::RunLoop() {
  for (;;) {
    Ready r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      run_cv_.wait(lock, [this] { return !ready_.empty(); });
      r = std::move(ready_.front());
      ready_.pop_front();
    }
    const auto start = profile_ ? Clock::now() : Clock::time_point{};
    if (profile_) profile_->Add(r.pending ? "watcher: watch queued" : "watcher: post queued", start - r.queued);
    r.fn(r.status);
    if (profile_) profile_->Add(r.pending ? "watcher: watch ran" : "watcher: post ran", Clock::now() - start);
  }
}

bool OpenCLBackend::TraceClTimes() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_TRACE_CL_TIMES");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

void OpenCLBackend::TraceTimes(cl_event event, std::string what) {
  clRetainEvent(event);
  EventWatcher::Get().Watch(event, [event, what = std::move(what)](cl_int status) {
    cl_ulong t[4] = {};
    const cl_profiling_info info[4] = {CL_PROFILING_COMMAND_QUEUED, CL_PROFILING_COMMAND_SUBMIT,
                                       CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END};
    for (int i = 0; i < 4; ++i) {
      cl_int err = clGetEventProfilingInfo(event, info[i], sizeof t[i], &t[i], nullptr);
      if (err != CL_SUCCESS) {
        log::Info("cl times {}: not available (status {}, {})", what, status, ClErrorName(err));
        return;
      }
    }
    log::Info("cl times {}: queued {:.1f} submit {:.1f} start {:.1f} end {:.1f}", what, t[0] / 1e3, t[1] / 1e3,
              t[2] / 1e3, t[3] / 1e3);
  });
}

Result<std::shared_ptr<HostBuffer>> MappedHostMemory(cl_context context, cl_device_id device, size_t n,
                                                     std::string_view what) {
  cl_int err = CL_SUCCESS;
  QueueRef queue(clCreateCommandQueueWithProperties(context, device, nullptr, &err));
  if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties", what);
  MemRef mem(clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, n, nullptr, &err));
  if (err != CL_SUCCESS) return ClError(err, "clCreateBuffer", what);
  void* p = clEnqueueMapBuffer(queue.get(), mem.get(), CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, nullptr, nullptr,
                               &err);
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueMapBuffer", what);
  return std::shared_ptr<HostBuffer>(std::make_shared<MappedHostBuffer>(std::move(queue), std::move(mem),
                                                                        static_cast<uint8_t*>(p), n, std::string(what)));
}

// The bulk channel's staging: mapped memory of device 0.
Result<std::shared_ptr<HostBuffer>> OpenCLBackend::BulkStaging(size_t n) {
  if (devices_.empty()) return Status(Code::kUnimplemented, "no device");
  return MappedHostMemory(devices_[0].context.get(), devices_[0].id, n, "bulk staging");
}

Result<SharedQueue> OpenCLBackend::TransferQueue(uint32_t device) {
  Device& d = devices_[device];
  if (!d.transfer_queue) {
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueueWithProperties(d.context.get(), d.id, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties", "transfer queue");
    d.transfer_queue = std::make_shared<QueueRef>(q);
  }
  return d.transfer_queue;
}

// What the destination half starts with: the buffer, the command's queue and wait list, a
// device buffer of the transfer's own and the device's transfer queue.
Result<OpenCLBackend::Staged> OpenCLBackend::Stage(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                                   const ir::u64s& wait, uint64_t signal) {
  auto b = Find(buffers_, buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), buffer, offset, size));
  Staged st;
  st.buffer = b.value();
  auto tq = TransferQueue(st.buffer->device);
  if (!tq.ok()) return tq.status();
  TANDEM_RETURN_IF_ERROR(Prepare(stream, st.buffer->device, wait, signal, &st.e));
  cl_int err = CL_SUCCESS;
  st.context = devices_[st.buffer->device].context.get();
  st.tmp = std::make_shared<MemRef>(clCreateBuffer(st.context, CL_MEM_READ_WRITE, size, nullptr, &err));
  if (err != CL_SUCCESS) return ClError(err, "clCreateBuffer", "server-to-server staging");
  st.transfer = std::move(tq).value();
  return st;
}

// In stream order, a non-blocking read of the range into host memory of the transfer's own,
// handed over once its event is done. (Only the completed read's bytes are looked at; a
// device copy into a private buffer and a blocking read of that from the watcher's thread, as
// the destination half does it, cost a buffer, a copy and a wake-up more per transfer: 8.4
// against 5.6 ms a step for advection n = 1024 on four servers, H100, 2026-11-24.)
Status OpenCLBackend::ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                 const ir::u64s& wait, uint64_t signal,
                                 std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) {
  auto b = Find(buffers_, buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), buffer, offset, size));
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(stream, b.value()->device, wait, signal, &e));
  auto host = std::make_shared<HeapHostBuffer>(size);
  cl_int err = clEnqueueReadBuffer(e.queue, b.value()->mem.get(), CL_FALSE, offset, size, host->data(), e.num_wait(),
                                   e.wait_list(), e.event_out(true));
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueReadBuffer", "server-to-server source");
  cl_event read = e.done;
  if (TraceClTimes()) TraceTimes(read, fmt::format("s2s read {}", size));
  clRetainEvent(read);
  Complete(e);
  clFlush(e.queue);
  EventWatcher::Get().Watch(read, [host, done = std::move(done)](cl_int status) {
    // An execution status, not an API error code (PoCL gives -1 to a command whose wait list failed).
    if (status < 0)
      return done(Status::Native(Api::kOpenCL, status,
                                 fmt::format("the read of a server-to-server transfer's source ended with execution "
                                             "status {} (it, or an event it waited for, failed)",
                                             status)));
    done(std::shared_ptr<HostBuffer>(host));
  });
  return Status::Ok();
}

Result<std::shared_ptr<Gate>> Gate::Make(cl_context context, std::shared_ptr<std::atomic<int>> open,
                                         std::shared_ptr<std::mutex> events_mu, const char* what) {
  cl_int err = CL_SUCCESS;
  cl_event event = clCreateUserEvent(context, &err);
  if (err != CL_SUCCESS) return ClError(err, "clCreateUserEvent", what);
  open->fetch_add(1);
  return std::shared_ptr<Gate>(new Gate(event, std::move(open), std::move(events_mu)));
}

// The stream copies the range in from a device buffer of the transfer's own, held by a user
// event; release writes the bytes into that buffer (blocking, on the transfer queue) and then
// sets the event, or fails it. (Writing the program's buffer itself from the transfer queue
// while the gate held its queue deadlocked on NVIDIA's OpenCL: a private buffer did not.)
Result<PendingWrite> OpenCLBackend::WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                                   const ir::u64s& wait, uint64_t signal) {
  auto st = Stage(stream, buffer, offset, size, wait, signal);
  if (!st.ok()) return st.status();
  Enqueue& e = st->e;
  // Until the gate is set, a wait may need its release: never in place (open_gates_).
  auto made = Gate::Make(st->context, open_gates_, events_mu_owner_, "server-to-server gate");
  if (!made.ok()) return made.status();
  std::shared_ptr<Gate> gate = std::move(made.value());
  e.wait.push_back(gate->get());
  cl_int err = clEnqueueCopyBuffer(e.queue, st->tmp->get(), st->buffer->mem.get(), 0, offset, size, e.num_wait(),
                                   e.wait_list(), e.signal || TraceClTimes() ? e.event_out(true) : nullptr);
  if (err != CL_SUCCESS) {
    e.EndFailureCheck();  // Fail takes events_mu_; nothing waits on the gate yet
    gate->Fail(CL_INVALID_OPERATION);
    return ClError(err, "clEnqueueCopyBuffer", "from server-to-server staging");
  }
  if (TraceClTimes()) TraceTimes(e.done, fmt::format("s2s gated copy {}", size));
  Complete(e);
  clFlush(e.queue);
  auto host = std::make_shared<HeapHostBuffer>(size);
  PendingWrite pending;
  pending.staging = host;
  // Runs where the bytes arrived (the worker's receive thread): the blocking write goes to the
  // watcher's thread. A failed gate fails the copy (Gate::Fail).
  pending.release = [tmp = st->tmp, gate, queue = st->transfer, host, size](const Status& got) {
    if (!got.ok()) return gate->Fail(FailedStatus(got));
    EventWatcher::Get().Post([tmp, gate, queue, host, size] {
      log::Trace("s2s write of {} bytes through {}: starts", size, static_cast<void*>(tmp->get()));
      cl_int err = clEnqueueWriteBuffer(queue->get(), tmp->get(), CL_TRUE, 0, size, host->data(), 0, nullptr, nullptr);
      if (err != CL_SUCCESS) return gate->Fail(err);
      gate->Open();
      log::Trace("s2s write of {} bytes through {}: gate set", size, static_cast<void*>(tmp->get()));
    });
  };
  return pending;
}

}  // namespace tandem::server::opencl
