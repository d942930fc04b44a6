// Work that finishes off the executor: the event watcher (a thread that sees OpenCL events
// complete and runs what waits for them) and the asynchronous halves of server-to-server
// copies (ReadToHost, WriteFromHost), whose host side runs on the watcher's thread while a
// gate holds the program's queue (see OpenGate).
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "opencl_backend.h"

namespace tandem::server::opencl {
namespace {

using Clock = std::chrono::steady_clock;

// Host memory of an asynchronous transfer (plain: only blocking OpenCL calls touch it).
class PlainHostBuffer final : public HostBuffer {
 public:
  explicit PlainHostBuffer(size_t n) : bytes_(new uint8_t[n]), size_(n) {}
  uint8_t* data() override { return bytes_.get(); }
  size_t size() const override { return size_; }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  size_t size_;
};

// A status for a user event that must fail: negative, as OpenCL requires.
cl_int FailedStatus(const Status& st) {
  if (st.api() == Api::kOpenCL && st.native() < 0) return st.native();
  return -(ir::kEventFailedTandem + static_cast<cl_int>(st.code()));
}

}  // namespace

EventWatcher& EventWatcher::Get() {
  static EventWatcher* w = new EventWatcher;  // its threads outlive every backend
  return *w;
}

namespace {
void CL_CALLBACK WatchCallback(cl_event, cl_int status, void* data) {
  std::unique_ptr<std::shared_ptr<EventWatcher::Pending>> p(static_cast<std::shared_ptr<EventWatcher::Pending>*>(data));
  EventWatcher::Get().Fire(*p, status);
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      std::thread([this] { PollLoop(); }).detach();
      std::thread([this] { RunLoop(); }).detach();
      started_ = true;
    }
    watches_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void EventWatcher::Fire(const std::shared_ptr<Pending>& p, cl_int status) {
  if (p->fired.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(Ready{std::move(p->fn), status, p});
  }
  run_cv_.notify_one();
}

// Polls every pending event: continuously while one of them is younger than kEager (a
// transfer or a dependency due any moment), then once a millisecond, beside the callbacks:
// PoCL never calls back for an event failed by its wait list, and NVIDIA's callbacks came
// 20-40 us after a poll saw the event (H100, driver 580). A callback's data is leaked when
// the implementation never calls it (a failed event on PoCL): a few bytes.
void EventWatcher::PollLoop() {
  constexpr auto kEager = std::chrono::milliseconds(2);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return !watches_.empty(); });
    std::vector<std::shared_ptr<Pending>> due;
    bool eager = false;
    const auto now = Clock::now();
    std::erase_if(watches_, [&](const std::shared_ptr<Pending>& p) {
      if (p->fired) return true;
      cl_int st = CL_QUEUED;
      cl_int err = clGetEventInfo(p->event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
      if (err != CL_SUCCESS) st = err;  // an event that cannot be asked about has failed
      if (st <= CL_COMPLETE) {
        due.emplace_back(p)->fired_status = st;
        return true;
      }
      eager |= now - p->since < kEager;
      return false;
    });
    lock.unlock();
    for (const auto& p : due) Fire(p, p->fired_status);
    if (eager) std::this_thread::yield();
    lock.lock();
    if (!eager) cv_.wait_for(lock, std::chrono::milliseconds(1));
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
    r.fn(r.status);
  }
}

Result<cl_command_queue> OpenCLBackend::TransferQueue(uint32_t device) {
  Device& d = devices_[device];
  if (!d.transfer_queue) {
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueueWithProperties(d.context.get(), d.id, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties", "transfer queue");
    d.transfer_queue.reset(q);
  }
  return d.transfer_queue.get();
}

// The stream's position as a marker (after its earlier work and `wait`) and, right after it,
// a gate that holds the rest of the stream until the host side of the transfer is done; the
// command's signal completes with the gate. The host side runs on the watcher's thread once
// the marker completes, with blocking calls on the transfer queue: no device memory of its
// own, nothing blocking on the executor or the worker's receive thread, and an
// implementation that reads a non-blocking write's host memory early cannot see it unfilled.
Result<OpenCLBackend::Gate> OpenCLBackend::OpenGate(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                                    const ir::u64s& wait, uint64_t signal) {
  auto b = Find(buffers_, buffer, "buffer");
  if (!b.ok()) return b.status();
  TANDEM_RETURN_IF_ERROR(CheckRange(*b.value(), buffer, offset, size));
  const uint32_t device = b.value()->device;
  auto tq = TransferQueue(device);
  if (!tq.ok()) return tq.status();
  Enqueue e;
  TANDEM_RETURN_IF_ERROR(Prepare(stream, device, wait, signal, &e));
  Gate g;
  cl_int err = CL_SUCCESS;
  g.gate = std::make_shared<EventRef>(clCreateUserEvent(devices_[device].context.get(), &err));
  if (err != CL_SUCCESS) return ClError(err, "clCreateUserEvent", "server-to-server gate");
  cl_event mark = nullptr;
  err = clEnqueueMarkerWithWaitList(e.queue, e.num_wait(), e.wait_list(), &mark);
  if (err != CL_SUCCESS) return ClError(err, "clEnqueueMarkerWithWaitList");
  g.mark = std::make_shared<EventRef>(mark);
  cl_event gate = g.gate->get();
  err = clEnqueueMarkerWithWaitList(e.queue, 1, &gate, e.event_out());
  if (err != CL_SUCCESS) {
    clSetUserEventStatus(gate, CL_INVALID_OPERATION);
    return ClError(err, "clEnqueueMarkerWithWaitList", "server-to-server gate");
  }
  Complete(e);
  clFlush(e.queue);
  cl_command_queue q = tq.value();
  clRetainCommandQueue(q);
  g.queue = std::make_shared<QueueRef>(q);
  clRetainMemObject(b.value()->mem.get());
  g.mem = std::make_shared<MemRef>(b.value()->mem.get());
  return g;
}

Status OpenCLBackend::ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                 const ir::u64s& wait, uint64_t signal,
                                 std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) {
  auto g = OpenGate(stream, buffer, offset, size, wait, signal);
  if (!g.ok()) return g.status();
  cl_event mark = g->mark->get();
  clRetainEvent(mark);
  EventWatcher::Get().Watch(mark, [g = std::move(g).value(), offset, size, done = std::move(done)](cl_int status) {
    if (status < 0) {
      clSetUserEventStatus(g.gate->get(), status);
      done(ClError(status, "the work before a server-to-server transfer's source"));
      return;
    }
    auto host = std::make_shared<PlainHostBuffer>(size);
    cl_int err = clEnqueueReadBuffer(g.queue->get(), g.mem->get(), CL_TRUE, offset, size, host->data(), 0, nullptr,
                                     nullptr);
    clSetUserEventStatus(g.gate->get(), err == CL_SUCCESS ? CL_COMPLETE : err);
    if (err != CL_SUCCESS) {
      done(ClError(err, "clEnqueueReadBuffer", "server-to-server source"));
      return;
    }
    done(std::shared_ptr<HostBuffer>(std::move(host)));
  });
  return Status::Ok();
}

Result<PendingWrite> OpenCLBackend::WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                                   const ir::u64s& wait, uint64_t signal) {
  auto g = OpenGate(stream, buffer, offset, size, wait, signal);
  if (!g.ok()) return g.status();
  auto host = std::make_shared<PlainHostBuffer>(size);
  PendingWrite pending;
  pending.staging = host;
  // Runs where the bytes arrived: the write itself waits for the stream's position, on the
  // watcher's thread.
  pending.release = [g = std::move(g).value(), host, offset, size](const Status& got) {
    if (!got.ok()) {
      clSetUserEventStatus(g.gate->get(), FailedStatus(got));
      return;
    }
    cl_event mark = g.mark->get();
    clRetainEvent(mark);
    EventWatcher::Get().Watch(mark, [g, host, offset, size](cl_int status) {
      cl_int err = status;
      if (status >= 0)
        err = clEnqueueWriteBuffer(g.queue->get(), g.mem->get(), CL_TRUE, offset, size, host->data(), 0, nullptr,
                                   nullptr);
      clSetUserEventStatus(g.gate->get(), err == CL_SUCCESS ? CL_COMPLETE : err);
    });
  };
  return pending;
}

}  // namespace tandem::server::opencl
