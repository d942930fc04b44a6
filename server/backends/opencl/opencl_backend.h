// The OpenCL backend: runs a session's commands on the devices of every OpenCL platform
// except Tandem's own, one cl_context per device. Client-chosen handles map to OpenCL
// objects in per-type tables; every field is checked before it reaches OpenCL, and
// OpenCL's own errors come back as Status::Native(Api::kOpenCL, err, ...).
//
// The implementation is split by API family: opencl_backend.cc (discovery, handles,
// queues and wait lists), opencl_device_info.cc, opencl_memory.cc, opencl_program.cc,
// opencl_launch.cc, opencl_events.cc, opencl_warm.cc, opencl_async.cc (the event watcher and
// asynchronous server-to-server copies).
#pragma once

#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tandem/server/backend.h"
#include "tandem/server/profile.h"

namespace tandem::server::opencl {

// Owns one reference to an OpenCL object and releases it with the matching clRelease*.
template <class T, cl_int (*Release)(T)>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T v) : v_(v) {}
  Ref(Ref&& o) noexcept : v_(std::exchange(o.v_, nullptr)) {}
  Ref& operator=(Ref&& o) noexcept {
    if (this != &o) reset(std::exchange(o.v_, nullptr));
    return *this;
  }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { reset(); }
  void reset(T v = nullptr) {
    if (v_) Release(v_);
    v_ = v;
  }
  T get() const { return v_; }
  explicit operator bool() const { return v_ != nullptr; }

 private:
  T v_ = nullptr;
};
using ContextRef = Ref<cl_context, clReleaseContext>;
using QueueRef = Ref<cl_command_queue, clReleaseCommandQueue>;
// A queue the backend's own waits and transfers share (FinishLater, Staged): they hold it
// through this, not through clRetainCommandQueue, whose release (which also flushes) took
// about 3 us of every kernel + clFinish on NVIDIA's OpenCL, before the reply
// (bench/results/2026-11-27-g.md). Const: nobody resets a queue a wait may still use.
using SharedQueue = std::shared_ptr<const QueueRef>;
using MemRef = Ref<cl_mem, clReleaseMemObject>;
using ProgramRef = Ref<cl_program, clReleaseProgram>;
using KernelRef = Ref<cl_kernel, clReleaseKernel>;
using EventRef = Ref<cl_event, clReleaseEvent>;

// Discovers the platforms and devices and creates one context per device.
Result<std::unique_ptr<Backend>> Open(const BackendOptions& options);

// "clXxx failed: CL_INVALID_VALUE (-30)[: detail]" as a native OpenCL status.
Status ClError(cl_int err, std::string_view call, std::string_view detail = {});
// A status for a user event that must fail: negative, as OpenCL requires.
cl_int FailedStatus(const Status& st);
// Without blocking: whether `event` has completed or failed (DeferredWait::done). A failed
// query counts as ended: its wait, which queries the same event, ends too.
bool Ended(cl_event event);
const char* ClErrorName(cl_int err);

// `n` bytes of CL_MEM_ALLOC_HOST_PTR memory of `context`, mapped until the buffer goes (the
// bulk channel's staging, the read slots). `what` names it in errors.
Result<std::shared_ptr<HostBuffer>> MappedHostMemory(cl_context context, cl_device_id device, size_t n,
                                                     std::string_view what);

// Mapped CL_MEM_ALLOC_HOST_PTR memory that small inline reads land in. NVIDIA's OpenCL
// takes a slower path for a non-blocking read into pageable memory: 17-51 us for 8 bytes on
// an H100, against 7-9 us into mapped memory or for a blocking read (two machines,
// bench/experiments/opencl_read_paths.c). A read takes a slot; the waiter copies it into the
// reply once the read is done, and the slot goes back when the last reference to it does.
class ReadSlots : public std::enable_shared_from_this<ReadSlots> {
 public:
  static constexpr size_t kSlotBytes = 64u << 10;
  static_assert(kSlotBytes >= ir::kInlineDataLimit, "a read a client sends inline fits a slot");
  static constexpr uint32_t kSlots = 16;
  static Result<std::shared_ptr<ReadSlots>> Make(cl_context context, cl_device_id device);
  explicit ReadSlots(std::shared_ptr<HostBuffer> memory);
  // A free slot of kSlotBytes, or null when every slot is in use (the caller reads into
  // pageable memory then). Thread-safe.
  std::shared_ptr<uint8_t> Take();
  uint32_t available();  // free slots now

 private:
  std::shared_ptr<HostBuffer> memory_;
  std::mutex mu_;
  std::vector<uint32_t> free_;
};

struct Device {
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  std::string name;
  std::string platform_name;
  ContextRef context;
  SharedQueue default_queue;  // stream 0: created on first use, with profiling
  // Server-to-server staging (opencl_async.cc): blocking host copies off the executor.
  SharedQueue transfer_queue;
  // Keepalive (OnWarm): its own queue, a small scratch buffer and an empty kernel.
  SharedQueue warm_queue;
  MemRef warm_scratch;
  ProgramRef warm_program;
  KernelRef warm_kernel;
  // Inline reads (ReadSlots above): made on the first small read; null after a failure.
  std::shared_ptr<ReadSlots> read_slots;
  bool read_slots_failed = false;
};
struct Buffer {
  MemRef mem;
  uint32_t device = 0;
  uint64_t size = 0;
  // Sub-buffers passed to kernels, by (origin, size); made once, freed with the buffer.
  std::map<std::pair<uint64_t, uint64_t>, MemRef> views;
};
struct Module {
  ProgramRef program;
  uint32_t device = 0;
  bool from_source = false;  // loaded from source: it compiles, and may be a compile's header
};
struct Function {
  KernelRef kernel;
  uint32_t device = 0;
  uint32_t num_args = 0;
  // The kernel's own local memory (before any local argument) and its device's: a launch whose
  // local arguments do not fit is refused here (PoCL aborts the process on one).
  uint64_t static_local = 0;
  uint64_t device_local = 0;
  // What each argument was last set to (its kind, then its bytes, buffer or local size):
  // an unchanged argument is not set again. Empty: not set yet.
  std::vector<std::vector<uint8_t>> last_args;
};
struct Stream {
  SharedQueue queue;
  uint32_t device = 0;
};
struct Event {
  EventRef event;  // null: created by EventCreate and not yet signalled (complete, as in CUDA)
  uint32_t device = 0;
  bool user = false;
};

class Gate;

// One enqueue's queue, resolved wait list and signal, prepared before the OpenCL call.
struct Enqueue {
  cl_command_queue queue = nullptr;
  uint32_t device = 0;
  std::vector<cl_event> wait;
  uint64_t signal = 0;
  cl_event done = nullptr;  // the command's event, filled by the enqueue call
  // The backend's events_mu_, held from the check of the wait list's statuses to the enqueue
  // call (released by EndFailureCheck, which Complete and WaitOnHost call, or with the
  // Enqueue): no event of the wait list is failed by OnUserEventSet or a server-to-server
  // gate in between. Never held across a wait.
  std::unique_lock<std::mutex> no_failures;
  // Stand-ins in the wait list for other devices' events (Prepare), alive until the enqueue
  // call has taken its reference: the watcher that sets one may drop its own before.
  std::vector<std::shared_ptr<Gate>> stand_ins;
  // The enqueue call is made, or a wait follows: OnUserEventSet may fail events again.
  void EndFailureCheck() {
    if (no_failures.owns_lock()) no_failures.unlock();
  }
  cl_uint num_wait() const { return static_cast<cl_uint>(wait.size()); }
  const cl_event* wait_list() const { return wait.empty() ? nullptr : wait.data(); }
  // Where the enqueue call writes its event: only when a signal (or the caller) needs it.
  cl_event* event_out(bool needed = false) { return signal || needed ? &done : nullptr; }
};

// Runs a function, on a thread of its own, once an OpenCL event is done (its status: CL_COMPLETE
// or negative). One per process: the worker has one session. See opencl_async.cc.
class EventWatcher {
 public:
  static EventWatcher& Get();
  // Takes over one reference to `event`.
  void Watch(cl_event event, std::function<void(cl_int status)> fn);

  // One watched event. It holds the reference Watch took over, so whoever still looks at the
  // event (the poller, a late callback) finds it alive.
  struct Pending {
    ~Pending() {
      if (event) clReleaseEvent(event);
    }
    cl_event event = nullptr;
    std::function<void(cl_int)> fn;
    std::chrono::steady_clock::time_point since;
    std::atomic<bool> fired{false};
    cl_int fired_status = 0;  // the poller's finding
  };
  // Hands a pending watch to the runner thread, once (from the callback or the poller).
  enum Via { kCallback, kYoungPoll, kSweep };
  void Fire(const std::shared_ptr<Pending>& p, cl_int status, Via via);
  // Runs fn on the watcher's thread, after what is already due there.
  void Post(std::function<void()> fn);
  // With TANDEM_SERVER_PROFILE=1: how watches fired (callback, young poll, sweep) and how
  // long what they run waited for and held the runner thread, logged as "profile:" lines.
  void LogProfile() {
    if (profile_) profile_->Log();
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Ready {
    std::function<void(cl_int)> fn;
    cl_int status = 0;
    std::shared_ptr<Pending> pending;  // keeps the event until fn has run (null: a Post)
    Clock::time_point queued;          // set only while profiling
  };
  void Start();
  void PollLoop();
  void RunLoop();
  std::mutex mu_;
  std::condition_variable cv_, run_cv_;
  std::vector<std::shared_ptr<Pending>> watches_;
  std::deque<Ready> ready_;
  std::once_flag started_;
  const std::shared_ptr<Profile> profile_ = Profile::FromEnv();
};

// A user event the backend holds commands behind until a transfer lets them go (a
// server-to-server copy's bytes arrived, a read's bytes reached the client). It counts in
// `open` (OpenCLBackend::open_gates_) until set or failed, once, whichever caller comes first
// (a link loss may fail it while its transfer does too). A failure is set under `events_mu`:
// on PoCL a failed gate fails, within the same call, every command already waiting on what it
// holds, and one the executor enqueues in between would never end (see Prepare).
class Gate {
 public:
  static Result<std::shared_ptr<Gate>> Make(cl_context context, std::shared_ptr<std::atomic<int>> open,
                                            std::shared_ptr<std::mutex> events_mu, const char* what);
  cl_event get() const { return event_.get(); }
  void Open() { Set(CL_COMPLETE); }
  void Fail(cl_int status) {
    std::lock_guard<std::mutex> lock(*events_mu_);
    Set(status);
  }

 private:
  Gate(cl_event event, std::shared_ptr<std::atomic<int>> open, std::shared_ptr<std::mutex> events_mu)
      : event_(event), open_(std::move(open)), events_mu_(std::move(events_mu)) {}
  void Set(cl_int status) {
    if (set_.exchange(true)) return;
    clSetUserEventStatus(event_.get(), status);
    open_->fetch_sub(1);
  }
  EventRef event_;
  std::shared_ptr<std::atomic<int>> open_;
  std::shared_ptr<std::mutex> events_mu_;
  std::atomic<bool> set_{false};
};

class OpenCLBackend : public Backend {
 public:
  OpenCLBackend(std::vector<Device> devices, std::string name);
  ~OpenCLBackend() override;

  std::string name() const override { return name_; }
  void LogProfile() override { EventWatcher::Get().LogProfile(); }
  uint32_t device_count() const override { return static_cast<uint32_t>(devices_.size()); }
  // NVIDIA's OpenCL (driver 580) submits a command that waits on a user event 0.5-1.8 ms
  // after the event is set when four processes share the GPU (H200, 4-server advection,
  // bench/experiments/opencl_cl_times.sh with ALIGN=1); a command enqueued after its
  // dependencies were met is submitted within microseconds.
  bool HoldsForPeers() const override { return true; }
  // No live user event (the program's, or an import's stand-in when not holding) and no
  // gate of ours not yet set (Gate): every enqueued command then waits only on others.
  bool EnqueuedCompleteAlone() const override { return user_events_ == 0 && open_gates_->load() == 0; }
  // Bytes that bulk transfers through host memory hold now (tests).
  uint64_t hosted_bytes_in_use() const { return hosted_bytes_->used(); }
  // Gates of ours not yet set or failed (tests).
  int open_gates() const { return open_gates_->load(); }
  // Bytes that writes enqueued behind a live user event or gate keep now (tests).
  uint64_t watched_write_bytes_in_use() const { return watched_writes_->used(); }

  Status OnDeviceInfo(const ir::DeviceInfoReq&, ir::DeviceInfoRep*) override;
  Status OnDeviceSync(const ir::DeviceSyncReq&, ir::DeviceSyncRep*) override;
  Status OnWarm(const ir::WarmReq&, ir::WarmRep*) override;

  Status OnBufferAlloc(const ir::BufferAllocReq&, ir::BufferAllocRep*) override;
  Status OnBufferFree(const ir::BufferFreeReq&, ir::BufferFreeRep*) override;
  Status OnBufferWrite(const ir::BufferWriteReq&, ir::BufferWriteRep*) override;
  Status OnBufferRead(const ir::BufferReadReq&, ir::BufferReadRep*) override;
  Status OnBufferCopy(const ir::BufferCopyReq&, ir::BufferCopyRep*) override;
  Status OnBufferFill(const ir::BufferFillReq&, ir::BufferFillRep*) override;
  Status OnBufferCopyRect(const ir::BufferCopyRectReq&, ir::BufferCopyRectRep*) override;

  Status OnModuleLoad(const ir::ModuleLoadReq&, ir::ModuleLoadRep*) override;
  Status OnModuleBuild(const ir::ModuleBuildReq&, ir::ModuleBuildRep*) override;
  Status OnModuleCompile(const ir::ModuleCompileReq&, ir::ModuleCompileRep*) override;
  Status OnModuleLink(const ir::ModuleLinkReq&, ir::ModuleLinkRep*) override;
  Status OnModuleBinary(const ir::ModuleBinaryReq&, ir::ModuleBinaryRep*) override;
  Status OnModuleFree(const ir::ModuleFreeReq&, ir::ModuleFreeRep*) override;
  Status OnFunctionGet(const ir::FunctionGetReq&, ir::FunctionGetRep*) override;
  Status OnFunctionFree(const ir::FunctionFreeReq&, ir::FunctionFreeRep*) override;

  Status OnLaunch(const ir::LaunchReq&, ir::LaunchRep*) override;

  Status OnStreamCreate(const ir::StreamCreateReq&, ir::StreamCreateRep*) override;
  Status OnStreamDestroy(const ir::StreamDestroyReq&, ir::StreamDestroyRep*) override;
  Status OnStreamSync(const ir::StreamSyncReq&, ir::StreamSyncRep*) override;
  Status OnStreamFlush(const ir::StreamFlushReq&, ir::StreamFlushRep*) override;
  Status OnMarker(const ir::MarkerReq&, ir::MarkerRep*) override;
  Status OnEventCreate(const ir::EventCreateReq&, ir::EventCreateRep*) override;
  Status OnEventDestroy(const ir::EventDestroyReq&, ir::EventDestroyRep*) override;
  Status OnEventQuery(const ir::EventQueryReq&, ir::EventQueryRep*) override;
  Status OnEventWait(const ir::EventWaitReq&, ir::EventWaitRep*) override;
  Status OnEventTimes(const ir::EventTimesReq&, ir::EventTimesRep*) override;
  Status OnUserEventSet(const ir::UserEventSetReq&, ir::UserEventSetRep*) override;

  // TANDEM_TRACE_CL_TIMES=1 (diagnosis): every queue profiles, and the device times of
  // kernels and of server-to-server reads and copies are logged once each ends, as
  // "cl times WHAT: queued Q submit S start B end E" (us of the device's profiling clock;
  // bench/experiments/cl_times.py reads them). Off, it costs one branch per command.
  static bool TraceClTimes();
  // Logs `event`'s times when it ends (retains its own reference). Only with TraceClTimes.
  static void TraceTimes(cl_event event, std::string what);

  // Tests only: runs in every command's preparation after its wait list's statuses were
  // checked, before the command is enqueued.
  void set_after_wait_check_for_test(std::function<void()> fn) { after_wait_check_ = std::move(fn); }
  Status NotifyWhenDone(uint64_t event, std::function<void(int32_t status)> done) override;
  Status ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                    uint64_t signal, std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) override;
  Result<PendingWrite> WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                     const ir::u64s& wait, uint64_t signal) override;
  // A non-blocking write straight from `bytes`, kept until the write's event is done.
  Status WriteHostBytes(uint64_t stream, uint64_t buffer, uint64_t offset, const ir::u64s& wait, uint64_t signal,
                        std::shared_ptr<HostBuffer> bytes) override;
  // Mapped host memory of device 0's context (CL_MEM_ALLOC_HOST_PTR), which NVIDIA's
  // OpenCL reads into and writes from by DMA, without a copy of its own.
  Result<std::shared_ptr<HostBuffer>> BulkStaging(size_t n) override;

 private:
  // ---- handles (opencl_backend.cc) ----
  Result<Device*> DeviceAt(uint64_t index);
  template <class T>
  Result<T*> Find(std::unordered_map<uint64_t, T>& table, uint64_t handle, std::string_view kind);
  template <class T>
  Status CheckNew(const std::unordered_map<uint64_t, T>& table, uint64_t handle, std::string_view kind) const;
  Status CheckRange(const Buffer& b, uint64_t handle, uint64_t offset, uint64_t size) const;

  // ---- enqueues (opencl_backend.cc) ----
  Result<cl_command_queue> DefaultQueue(uint32_t device);
  Result<SharedQueue> TransferQueue(uint32_t device);

  // The start of an asynchronous transfer's destination half (opencl_async.cc).
  struct Staged {
    Buffer* buffer = nullptr;
    Enqueue e;                         // the command's queue, wait list and signal
    cl_context context = nullptr;
    std::shared_ptr<MemRef> tmp;       // the transfer's own device buffer
    SharedQueue transfer;  // the device's transfer queue
  };
  Result<Staged> Stage(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                       uint64_t signal);

  // Resolves stream (0: the device's default queue), wait list and signal for `device`.
  Status Prepare(uint64_t stream, uint32_t device, const ir::u64s& wait, uint64_t signal, Enqueue* e);
  // A gate in `device`'s context that the event watcher sets when `event` (of another device)
  // ends; null when it has already completed, an error when it has failed.
  Result<std::shared_ptr<Gate>> StandIn(uint64_t handle, cl_event event, uint32_t device);
  // Binds the command's event to its signal handle (or releases it when there is none).
  void Complete(Enqueue& e);
  // Waits on the host for a prepared wait list (used where a chunked copy must not block
  // on device events between chunks).
  Status WaitOnHost(Enqueue& e);
  Status FinishDevice(uint32_t device);
  Status FinishLater(std::vector<SharedQueue> queues);
  static void FinishUnlessEnqueued(const SharedQueue& q, const std::atomic<uint64_t>& prepared, uint64_t since);
  void FlushBeforeWait(cl_command_queue q);
  Result<cl_mem> SubBuffer(Buffer& b, uint64_t handle, const ir::bytes& range);

  // ---- memory (opencl_memory.cc) ----
  Status WriteInline(const ir::BufferWriteReq& req, Buffer& b, Enqueue& e);
  // A non-blocking write of `bytes` at `offset`, which it keeps until the write is done.
  Status WriteKeeping(Buffer& b, Enqueue& e, uint64_t offset, std::shared_ptr<HostBuffer> bytes, std::string_view what,
                      bool watched = false);
  Status WriteRemote(const ir::BufferWriteReq& req, Buffer& b, Enqueue& e);
  Status ReadRemote(const ir::BufferReadReq& req, Buffer& b, Enqueue& e);
  // A buffer of `size` bytes, counted in hosted_bytes_, for a bulk transfer that must pass
  // through host memory; null when it need not or cannot (the chunked path then).
  std::shared_ptr<HostBuffer> HostedBulk(uint64_t size);
  Status ReadThroughHost(const ir::BufferReadReq& req, Buffer& b, Enqueue& e, std::shared_ptr<HostBuffer> bytes);
  std::shared_ptr<uint8_t> ReadSlot(uint32_t device);
  // The deferred half of a small read, enqueued (and flushed) into `slot`, or into `out`
  // when there is no slot: waits for `read` (taking that reference) off the executor, then
  // copies the slot's n bytes to `out`, the reply's. `hold` lives until then.
  Status ReplyWhenRead(cl_event read, std::shared_ptr<uint8_t> slot, uint8_t* out, size_t n, const char* what,
                       std::shared_ptr<const void> hold = nullptr);
  Status SignalAfter(Enqueue& e);

  // ---- programs (opencl_program.cc) ----
  Status DescribeKernel(cl_kernel kernel, cl_device_id device, ir::FunctionInfo* info);
  // Every kernel of a built (or linked) executable program, described for the client.
  Status DescribeKernels(cl_program program, cl_device_id device, ir::FuncList* out);
  // The build log of `program` on `device`.
  Status BuildLog(cl_program program, cl_device_id device, std::string* log);

  std::string name_;
  // Declared first so it is destroyed last: every object below belongs to a context here.
  std::vector<Device> devices_;
  std::unordered_map<uint64_t, Buffer> buffers_;
  std::unordered_map<uint64_t, Module> modules_;
  std::unordered_map<uint64_t, Function> functions_;
  std::unordered_map<uint64_t, Stream> streams_;
  std::unordered_map<uint64_t, Event> events_;
  int user_events_ = 0;  // entries of events_ that are user events (executor only)
  // Markers and barriers, each with a reference of ours until it is no longer pending
  // (executor only): PoCL 3.1 aborts the process (pocl_update_event_failed: "PTHREAD ERROR ...
  // Invalid argument") when a marker or barrier whose event was released fails, through an
  // event of its wait list or a failed command before it in its queue; a program doing so
  // natively aborts too (found by opencl_backend_fuzz; reproduced with plain OpenCL on PoCL
  // 3.1). Commands of other kinds fail cleanly there.
  std::vector<cl_event> held_markers_;
  // Commands prepared so far (Prepare), read by deferred waits on other threads (FinishLater).
  std::shared_ptr<std::atomic<uint64_t>> prepared_ = std::make_shared<std::atomic<uint64_t>>(0);
  size_t prune_markers_at_ = 16;
  void HoldMarker(cl_event marker);  // takes over one reference
  // Gates (WriteFromHost's, ReadThroughHost's) not yet set or failed: while one is, a wait
  // may need its release. Counted up by the executor, down by the thread that sets the gate,
  // after it has: zero read by the executor means every gate made so far is set.
  std::shared_ptr<std::atomic<int>> open_gates_ = std::make_shared<std::atomic<int>>(0);
  // The host memory of bulk transfers through host memory (HostedBulk), apart from the
  // session's server-to-server budget so they never push those copies onto their blocking path.
  static constexpr uint64_t kHostedBulkBytes = 1ull << 30;
  std::shared_ptr<HostBytesBudget> hosted_bytes_ = std::make_shared<HostBytesBudget>(kHostedBulkBytes);
  // What WriteKeeping's writes behind a user event or gate hold: counted only, never refused
  // (their bytes came with the request, or from another server, and are in memory already).
  std::shared_ptr<HostBytesBudget> watched_writes_ =
      std::make_shared<HostBytesBudget>(std::numeric_limits<uint64_t>::max());
  // Guards changes to events_ against OnUserEventSet, which runs on the receive thread;
  // the executor, the only writer, reads without it. Also held from a command's wait-list
  // check to its enqueue (Enqueue::no_failures), so OnUserEventSet fails no event between,
  // nor a server-to-server gate's release (WriteFromHost), which holds it through
  // events_mu_owner_ since it may run after the backend is gone.
  std::shared_ptr<std::mutex> events_mu_owner_ = std::make_shared<std::mutex>();
  std::mutex& events_mu_ = *events_mu_owner_;
  std::function<void()> after_wait_check_;
};

// Reads a clGet*Info answer of any size into bytes.
template <class Fn>
cl_int QueryBytes(Fn&& query, std::vector<uint8_t>* out) {
  size_t size = 0;
  cl_int err = query(0, nullptr, &size);
  if (err != CL_SUCCESS) return err;
  out->assign(size, 0);
  return size ? query(size, out->data(), nullptr) : CL_SUCCESS;
}
// Same, for a string answer (without its terminating NUL).
template <class Fn>
cl_int QueryString(Fn&& query, std::string* out) {
  std::vector<uint8_t> bytes;
  cl_int err = QueryBytes(query, &bytes);
  if (err != CL_SUCCESS) return err;
  out->assign(bytes.begin(), bytes.end());
  while (!out->empty() && out->back() == '\0') out->pop_back();
  return CL_SUCCESS;
}

}  // namespace tandem::server::opencl
