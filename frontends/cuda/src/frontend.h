// Internal state of the CUDA front end, shared by the files of each API family.
//
// Locking: one mutex (Frontend::mu) guards every shared table below. It is held for
// bookkeeping and for the few one-time round trips (device set-up, module and function
// loading, symbol lookup), and released before anything that waits on the GPU (syncs,
// reads back). Reply callbacks run where the runtime routes replies (its receiver thread, or
// a thread blocked in a call, which may hold it) and never take it.
// The current device, the last error and the launch configuration stack are per thread.
#pragma once

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "range_allocator.h"
#include "tandem/client/runtime.h"
#include "tandem/log.h"

#define TANDEM_API extern "C" __attribute__((visibility("default")))

#define TANDEM_RETURN_CUDA_IF_ERROR(expr)          \
  do {                                             \
    if (cudaError_t _e = (expr); _e != cudaSuccess) \
      return _e;                                   \
  } while (0)

namespace tandem::cuda {

// ---- errors (errors.cc) -------------------------------------------------------------------
// Records `e` as the calling thread's last error (unless it is cudaSuccess) and returns it.
cudaError_t Return(cudaError_t e);
// A failure of the remote side, translated at the API edge (CUresult codes for API errors).
cudaError_t ToCuda(const Status& st);
cudaError_t FromCuResult(int32_t cu);
// Errors that leave the device unusable until cudaDeviceReset (CUDA's "sticky" errors).
bool IsSticky(cudaError_t e);
// cudaErrorNotSupported, logged once per entry point.
cudaError_t Unsupported(const char* name);

// ---- registration (registration.cc) -------------------------------------------------------
struct FatBinary {
  const void* image = nullptr;  // the fatbinary as nvcc embedded it, header included
  size_t size = 0;
  bool valid = false;           // magic numbers checked at registration
  bool managed = false;         // declares __managed__ variables: its kernels are not launched
  bool hashed = false;
  XXH128_hash_t hash{};         // content hash: one ModuleLoad per image per device
};

struct Kernel {
  FatBinary* fatbin = nullptr;
  const void* host_fun = nullptr;
  std::string name;             // the mangled device name
  std::map<uint32_t, int32_t> attrs;  // cudaFuncSetAttribute values, applied on every device
  std::optional<uint32_t> cache_config;  // cudaFuncSetCacheConfig's, applied on every device
};

struct Symbol {
  FatBinary* fatbin = nullptr;
  const void* host_var = nullptr;
  std::string name;
  size_t size = 0;
};

// ---- per device (context.cc) ----------------------------------------------------------------
struct Function {
  uint64_t handle = 0;
  ir::FunctionInfo info;
  int32_t Attr(uint32_t cu_attr, int32_t fallback) const;
};

struct Allocation {
  uint64_t handle = 0;  // BufferAlloc handle
  uint64_t size = 0;
  bool chunk = false;   // a chunk that small allocations are carved from
  std::unique_ptr<RangeAllocator> carve;  // chunks only
};

struct DeviceContext {
  int index = 0;
  client::Device* dev = nullptr;
  bool ready = false;             // address range reserved on both sides
  cudaError_t unusable = cudaSuccess;
  uint64_t va_base = 0, va_size = 0, granularity = 0;
  std::unique_ptr<RangeAllocator> va;         // the device's address range
  std::map<uint64_t, Allocation> allocations; // by address: large allocations and chunks
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> small;  // address -> (chunk, size)
  uint64_t allocated = 0;                     // bytes of address range in use
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> modules;  // image hash -> module handle
  std::map<const Kernel*, Function> functions;
  std::map<const Symbol*, std::pair<uint64_t, uint64_t>> globals;  // -> (address, size)
  cudaError_t sticky = cudaSuccess;
  unsigned flags = 0;             // cudaSetDeviceFlags
  cudaFuncCache cache_config = cudaFuncCachePreferNone;  // cudaDeviceSetCacheConfig
  // The stream priorities of the device's context (least, greatest), asked of the server once.
  std::optional<std::pair<int, int>> priorities;
  // Events of other servers that a stream of this device waits on (cudaStreamWaitEvent), by
  // stream handle (0: the default stream): a copy from such a server on that stream reads its
  // source only after them, since the stream's own order cannot reach that server.
  std::map<uint64_t, std::vector<std::pair<client::Session*, uint64_t>>> foreign_waits;
  // The events of `source` that a copy on `stream` must have its source wait for.
  std::vector<uint64_t> ForeignWaits(uint64_t stream, const client::Session* source) const;
  int32_t Attr(int attr, int32_t fallback = 0) const;
  // The limits every launch is checked against, read from the properties once (Attr scans
  // them: ten scans showed in a launch's profile, 2026-11-27-f). Needs mu.
  struct LaunchLimits {
    uint64_t threads = 0;
    unsigned block[3] = {}, grid[3] = {};
    size_t shared = 0;
  };
  const LaunchLimits& Limits() const;
  mutable std::optional<LaunchLimits> launch_limits;
  client::Session& session() const { return *dev->session; }
  uint64_t remote() const { return dev->remote_index; }
};

// A host region the program pinned (cudaMallocHost, cudaHostAlloc, cudaHostRegister): its
// registrations with each session, made once and reused by every copy from or to it.
struct HostRegion {
  void* base = nullptr;
  size_t size = 0;
  bool owned = false;  // allocated by us (cudaMallocHost / cudaHostAlloc)
  unsigned flags = 0;
  std::map<client::Session*, std::shared_ptr<fabric::MemoryRegion>> mr;
};

class CallbackQueue;  // stream_event.cc

struct Stream {
  ~Stream();  // lets queued host callbacks finish, then ends their thread
  uint64_t handle = 0;
  int device = 0;
  unsigned flags = 0;
  int priority = 0;
  std::shared_ptr<CallbackQueue> callbacks;  // created by the first host callback
};

struct Event {
  uint64_t handle = 0;
  int device = 0;
  unsigned flags = 0;
  bool recorded = false;  // an event never recorded is complete, as in CUDA
  unsigned long long capture = 0;  // the capture whose stream last recorded it (0: none)
  uint64_t record_stream = 0;         // where it was last recorded (IR handle)
  uint64_t copies_before_record = 0;  // the last asynchronous copy's ticket then
  // Stand-ins of its current record on other servers, for their streams to wait on (made by
  // cudaStreamWaitEvent, dropped when the event is recorded again or destroyed).
  client::StandIns imports;
};

// A memory pool; a cudaMemPool_t is its address. Each device has a default pool, made on first
// use, and cudaMemPoolCreate makes more. Tandem's pools hold no memory of their own: what
// cudaFreeAsync gives back is released at the first synchronize known to be past the free
// (ReleaseFreedAsync), as CUDA's pools do with a release threshold of 0, whatever threshold
// is set. A pool keeps its attributes and counts what its allocations take.
struct MemPool {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;  // by cudaMemPoolDestroy: no longer a valid handle
  uint64_t cap = 0;        // what it may reserve, from cudaMemPoolProps::maxSize (0: no cap)
  uint64_t release_threshold = 0;
  int reuse[3] = {1, 1, 1};  // cudaMemPoolReuseFollowEventDependencies .. AllowInternalDependencies
  uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
  void Use(uint64_t bytes) {
    used += bytes;
    used_high = std::max(used_high, used);
  }
  void Reserve(uint64_t bytes) {
    reserved += bytes;
    reserved_high = std::max(reserved_high, reserved);
  }
};

// Stream capture and graphs (graphs.cc). A graph is the list of calls captured on one stream,
// each kept as what makes that call again on a given stream (GraphOp): launching the graph
// makes them, in order, on the launch stream. A node's kind ("kernel <stub>", "memcpy", ...)
// lets cudaGraphExecUpdate tell whether two graphs have the same shape; a node's address is
// its cudaGraphNode_t.
using GraphOp = std::function<cudaError_t(cudaStream_t)>;
struct GraphNode {
  std::string kind;
  GraphOp op;
};
struct Graph {
  std::vector<std::unique_ptr<GraphNode>> nodes;
};
struct GraphExec {
  std::shared_ptr<const std::vector<GraphNode>> nodes;
  // Each launch is ordered behind the one before, whatever its stream: the stream of the
  // last launch, and an event recorded after it on that stream's device.
  cudaStream_t last_stream = nullptr;
  bool launched = false;
  cudaEvent_t done = nullptr;
  int done_device = -1;
};
// One stream's capture, from cudaStreamBeginCapture to cudaStreamEndCapture.
struct Capture {
  unsigned long long id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  bool invalidated = false;
  Graph* graph = nullptr;  // in Frontend::graphs
  std::vector<cudaGraphNode_t> dependencies;  // what cudaStreamGetCaptureInfo last gave out
};

class Frontend {
 public:
  static Frontend& Get();

  std::mutex mu;

  // Registration tables (filled by static constructors, before main).
  std::vector<std::unique_ptr<FatBinary>> fatbins;
  std::map<const void*, std::unique_ptr<Kernel>> kernels;  // by host stub address
  std::set<const Kernel*> kernel_set;                      // valid cudaKernel_t values
  std::map<const void*, std::unique_ptr<Symbol>> symbols;  // by host shadow variable
  std::atomic<bool> exiting{false};

  // Devices, connected on first use (never from a static constructor).
  // Returns nullptr and the reason if there are none.
  cudaError_t Devices(std::vector<DeviceContext*>** out);
  // The calling thread's current device, set up for use (address range reserved). Needs mu.
  cudaError_t Current(DeviceContext** out);
  cudaError_t Device(int index, DeviceContext** out);  // the same, for any index. Needs mu.
  // The device if it was already set up, without connecting anywhere. Needs mu.
  DeviceContext* Existing(int index) const;
  // Every device known so far (empty before the first connection). Needs mu.
  const std::vector<DeviceContext*>& known() const { return device_list_; }

  // Pinned host memory, by base address.
  std::map<uintptr_t, HostRegion> host_regions;
  const HostRegion* FindHost(const void* p, size_t n) const;

  // Memory cudaFreeAsync gave back: still allocated here and on the server until the stream
  // it was freed on is known to be past the free (ReleaseFreedAsync).
  struct FreedAsync {
    int stream_device = 0;
    uint64_t stream = 0;  // IR handle (0: that device's default stream)
    uint64_t address = 0;
    uint64_t order = 0;   // freed_async_count when it was freed
  };
  std::vector<FreedAsync> freed_async;
  uint64_t freed_async_count = 0;

  // Memory pools (pools.cc): the pools, by handle (a destroyed one stays while allocations
  // are still counted on it: Unpool); each device's default pool, and its current pool
  // where cudaDeviceSetMemPool chose one other than the default; the pool and footprint of each stream-ordered
  // allocation, by address, until its memory is given back (FreeNow) or its device reset.
  std::map<const void*, std::unique_ptr<MemPool>> pools;
  std::map<int, MemPool*> default_pool, current_pool;
  struct Pooled {
    MemPool* pool = nullptr;
    uint64_t footprint = 0;
    bool freed = false;  // by cudaFreeAsync: no longer used, still held (reserved)
  };
  std::map<uint64_t, Pooled> pooled;

  // Streams and events: client objects whose addresses are the cudaStream_t / cudaEvent_t.
  std::map<const void*, std::unique_ptr<Stream>> streams;
  std::map<const void*, std::unique_ptr<Event>> events;

  // Graphs and their instantiations by handle, and the captures under way by stream; `capturing`
  // counts those so that calls skip the capture check (and the lock) while there is none.
  std::map<const void*, std::unique_ptr<Graph>> graphs;
  std::map<const void*, std::unique_ptr<GraphExec>> graph_execs;
  std::map<const void*, Capture> captures;
  std::atomic<int> capturing{0};
  unsigned long long next_capture_id = 1;

  // Asynchronous copies whose host side is not done yet (a cudaMemcpyAsync D2H that has not
  // landed, an H2D whose source is still read); every sync point waits for them. Each has a
  // ticket, in the order they began: a host callback waits for those that began before it.
  uint64_t BeginPending(uint64_t stream);
  void EndPending(uint64_t ticket, const Status& st);
  cudaError_t WaitPending();
  // The last ticket given out, and a wait for the copies up to it on one stream (IR handle;
  // 0, the legacy default stream: on every stream). An event after them in stream order may
  // be complete on the server while the reply that lands a read is still on its way (under
  // fault tolerance the read's answer also waits for every replica's vote): whoever acts on
  // that event (a host callback, a query that found it complete) waits for them first. They
  // are done on the device, so the wait is short.
  uint64_t LastPendingTicket();
  // Which copies a waiter on `stream` waits for follows CUDA's legacy default stream: those on
  // its own stream; on stream 0 also those on every blocking stream; on a blocking stream also
  // those on stream 0 (cudaStreamNonBlocking streams are noted by NoteStream).
  void WaitPendingThrough(uint64_t ticket, uint64_t stream);
  void NoteStream(uint64_t stream, bool non_blocking);
  void ForgetStream(uint64_t stream);
  // Taken across posting a copy that has a ticket (from WaitCallbacks to its post), and across
  // posting a host callback's gate with the last ticket it waits for, after mu: a copy the
  // callback waits for is then always posted before the gate, never behind it, where the
  // callback and the copy would wait for each other. Also from WaitCallbacks to the post of
  // every command that may block on the server (AfterCallbacks).
  std::mutex post_order;

  // Host callbacks not yet run. tandemd runs a session's commands one at a time, and a
  // command that blocks on a stream held by a callback's gate would keep the gate from ever
  // opening: anything that may block on the server waits for the callbacks first.
  void BeginCallback();
  void EndCallback();
  void WaitCallbacks();
  // post_order, taken once the host callbacks queued so far have run: what the caller posts
  // before releasing it cannot land behind a callback's gate (AddCallback posts its gate under
  // post_order), where a command that blocks on the server (a synchronize, an event wait, a
  // free that waits for the device, a read) would hold the server's session while the
  // callback's own queries wait behind it: both for ever. Callbacks must not call CUDA, as in
  // CUDA: one that did could wait for a thread that waits here. The caller may hold mu
  // (taken before post_order), not post_order.
  [[nodiscard]] std::unique_lock<std::mutex> AfterCallbacks() {
    std::unique_lock<std::mutex> order(post_order);
    WaitCallbacks();
    CallbackGapForTests();
    return order;
  }
  // A command that may block on the server, posted under AfterCallbacks; post_order is
  // released once it is posted, before its reply is waited for.
  template <class Req>
  Result<typename Req::Reply> CallAfterCallbacks(client::Session& session, const Req& req) {
    std::unique_lock<std::mutex> order = AfterCallbacks();
    return session.Call(req, order);
  }

 private:
  // TANDEM_TEST_CALLBACK_GAP_US (tests only): AfterCallbacks sleeps this long between the
  // callbacks' end and its return, widening the window another thread's callback would take
  // if post_order did not keep it out.
  void CallbackGapForTests();
  cudaError_t Connect();
  cudaError_t SetUp(DeviceContext& d);

  bool connected_ = false;
  cudaError_t connect_error_ = cudaSuccess;
  std::vector<std::unique_ptr<DeviceContext>> devices_;
  std::vector<DeviceContext*> device_list_;

  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::map<uint64_t, uint64_t> pending_;  // the copies not done yet: ticket -> stream
  std::set<uint64_t> non_blocking_;       // IR handles of cudaStreamNonBlocking streams
  uint64_t last_ticket_ = 0;
  Status pending_error_;
  int callbacks_ = 0;  // guarded by pending_mu_
};

// The calling thread's current device index (cudaSetDevice).
int& CurrentIndex();

// Loads the kernel's image on the device and resolves the function (once per device). Needs mu.
cudaError_t EnsureFunction(DeviceContext& d, const Kernel& k, const Function** out);
// Updates the cached attribute (kCudaFuncAttrBase + CUfunction_attribute) of a function.
void SetFunctionAttr(Function& fn, uint32_t cu_attr, int32_t value);
// Device attributes Tandem reports as 0 whatever the GPU says (context.cc).
bool RemoteLacks(int attr);
// The device address and size of a __device__ / __constant__ symbol (once per device). Needs mu.
cudaError_t EnsureSymbol(DeviceContext& d, const Symbol& s, uint64_t* address, uint64_t* size);
// Collects the asynchronous errors the device's session reported; the first one is returned,
// sticky ones stay on the device. Call at sync points, without mu.
cudaError_t TakeAsyncErrors(DeviceContext& d);
// Frees every remote module of a fat binary (cudaUnregisterFatBinary, best effort). Needs mu.
void ForgetFatBinary(const FatBinary* fb);

// Kernel lookup for launches: by host stub (cudaLaunchKernel) or by cudaKernel_t. Needs mu.
const Kernel* FindKernel(const void* host_fun_or_kernel);

// Releases what cudaFreeAsync gave back on stream `stream` of device `stream_device` (on every
// stream of it when `stream` is empty) up to the free numbered `up_to` (freed_async_count when
// the caller posted the synchronize that it knows the device is past). Needs mu.
void ReleaseFreedAsync(int stream_device, std::optional<uint64_t> stream, uint64_t up_to);

// Where a pointer lives: on which device, and inside which allocation or symbol. Needs mu.
struct DevicePtr {
  DeviceContext* device = nullptr;
  uint64_t address = 0;
  uint64_t room = 0;  // bytes from address to the end of its allocation or symbol
};
std::optional<DevicePtr> FindDevicePtr(const void* p);

// Stream handle as the IR knows it (0: the device's default stream) and its device.
struct StreamRef {
  uint64_t handle = 0;
  int device = -1;  // -1: the default stream of whichever device the command is for
};
cudaError_t ResolveStream(cudaStream_t s, StreamRef* out);  // Needs mu.
// The device a stream's commands go to (the current one for the default stream) and its IR
// handle. Needs mu.
cudaError_t StreamTarget(cudaStream_t stream, DeviceContext** d, StreamRef* ref);
// cudaMallocAsync's work (memory.cc): `size` bytes from `pool`, in the order of stream `s` of
// device `sd`, with `lock` held on mu (released while held frees are synchronized away).
cudaError_t StreamOrderedAlloc(std::unique_lock<std::mutex>& lock, MemPool& pool, DeviceContext& sd,
                               const StreamRef& s, size_t size, void** ptr);
// Pools (pools.cc), each needing mu: the device's default pool (made on first use) and its
// current one; the pool a handle names (nullptr: none, or destroyed); a device's reset, which
// forgets the stream-ordered allocations on it and makes its default pool current again.
MemPool* DefaultPool(int device);
MemPool* CurrentPool(int device);
MemPool* FindPool(const void* handle);
void ResetPools(DeviceContext& d);
// The pool lets go of a stream-ordered allocation (its memory given back, or its device reset)
// and is forgotten if it was destroyed and counts nothing more. Returns the next entry.
std::map<uint64_t, Frontend::Pooled>::iterator Unpool(std::map<uint64_t, Frontend::Pooled>::iterator it);

// Stream capture (graphs.cc). The capture of `stream`, if it is capturing. Needs mu.
Capture* CaptureOf(cudaStream_t stream);
// Adds a node to a capture (cudaErrorStreamCaptureInvalidated once it was invalidated), or,
// for a call that cannot be captured (`what` names it, logged once), invalidates the capture
// and answers cudaErrorStreamCaptureUnsupported, as CUDA does. Need mu.
cudaError_t Record(Capture& c, std::string kind, GraphOp op);
cudaError_t Refuse(Capture& c, const std::string& what);
// The same refusal for what CUDA refuses too (nothing logged). Needs mu.
cudaError_t Invalidate(Capture& c);
// Ends a capture with its graph (its stream destroyed), or every capture of the streams on
// device `device` (the device reset). Need mu.
void DropCapture(cudaStream_t stream);
void DropCaptures(int device);
// The capture under way with that id (Event::capture), or nullptr. Needs mu.
Capture* CaptureById(unsigned long long id);
// For a call on `stream`: nothing while it is not capturing; otherwise Record(op), or, for a
// call CUDA does not capture (`op` empty), Invalidate. Takes mu.
std::optional<cudaError_t> Captured(cudaStream_t stream, std::string kind, GraphOp op);

// Waits for everything queued on the device (its streams, pending copies and callbacks) and
// returns what went wrong asynchronously. Call without holding Frontend::mu.
cudaError_t SyncDevice(DeviceContext& d);

}  // namespace tandem::cuda
