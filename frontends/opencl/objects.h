// The OpenCL objects of the Tandem ICD and what every family file shares: reference
// counting, validation of handles, the info-answer helper, the status mapping and the
// declarations of the entry points (generated from entries.def).
//
// Every object starts with the dispatch pointer (the ICD loader reads it blindly), so no
// object type has virtual functions. Objects are destroyed when the application's count
// and the internal holds (a buffer holds its context, a kernel its program, a pending read
// its event...) have both reached zero; remote handles are freed by the destructors.
#pragma once

#include <CL/cl_icd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tandem/client/runtime.h"
#include "tandem/ir/ir.h"
#include "tandem/log.h"
#include "tandem/status.h"

namespace tandem::ocl {

extern const cl_icd_dispatch kDispatch;

// The implemented entry points, declared with the dispatch table's own function types.
#define I(Name) std::remove_pointer_t<cl_api_cl##Name> Name;
#define U(Name, err)
#include "entries.def"
#undef I
#undef U

// ---- reference counting and validation --------------------------------------------------

// The set of live objects of one type: a handle the application passes in is only
// dereferenced once it is found here.
template <class T>
class Registry {
 public:
  static void Add(const T* p) {
    std::lock_guard lock(State().mu);
    State().live.insert(p);
  }
  static void Remove(const T* p) {
    std::lock_guard lock(State().mu);
    State().live.erase(p);
  }
  static bool Contains(const void* p) {
    std::lock_guard lock(State().mu);
    return State().live.count(static_cast<const T*>(p)) != 0;
  }
  // An internal hold on p if it is still a live object, not being destroyed (the registry's
  // lock keeps its deletion, which removes it first, from happening meanwhile).
  static bool TryHoldLive(T* p) {
    std::lock_guard lock(State().mu);
    return State().live.count(static_cast<const T*>(p)) != 0 && p->TryHold();
  }

 private:
  struct S {
    std::mutex mu;
    std::unordered_set<const T*> live;
  };
  static S& State() {
    static S* s = new S;  // never destroyed: objects may be released during exit
    return *s;
  }
};

template <class T>
struct Object {
  const cl_icd_dispatch* dispatch = &kDispatch;  // first member: the loader dispatches on it
  std::atomic<cl_uint> refs{1};   // the application's references (CL_*_REFERENCE_COUNT)
  std::atomic<cl_uint> holds{1};  // one for refs > 0, plus one per internal reference

  void Retain() { refs.fetch_add(1); }
  // False when the application held no reference.
  bool Release() {
    cl_uint r = refs.load();
    do {
      if (r == 0) return false;
    } while (!refs.compare_exchange_weak(r, r - 1));
    if (r == 1) Unhold();
    return true;
  }
  void Hold() { holds.fetch_add(1); }
  // Takes a hold only if the object is not already being destroyed.
  bool TryHold() {
    cl_uint h = holds.load();
    do {
      if (h == 0) return false;
    } while (!holds.compare_exchange_weak(h, h + 1));
    return true;
  }
  void Unhold() {
    if (holds.fetch_sub(1) != 1) return;
    T* self = static_cast<T*>(this);
    Registry<T>::Remove(self);
    delete self;
  }
};

// An internal reference, released when the holder goes (used in reply callbacks).
template <class T>
class Held {
 public:
  Held() = default;
  explicit Held(T* p) : p_(p) {
    if (p_) p_->Hold();
  }
  Held(const Held& o) : Held(o.p_) {}
  Held(Held&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Held& operator=(Held o) {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Held() {
    if (p_) p_->Unhold();
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

// A handle the application may use: live and still referenced by it.
template <class T>
bool Valid(T* p) {
  return p && Registry<T>::Contains(p) && p->refs.load() > 0;
}

// Registers a new object (refs = holds = 1) and returns it.
template <class T>
T* Publish(T* p) {
  Registry<T>::Add(p);
  return p;
}

// ---- answers to info queries ------------------------------------------------------------

// Every clGet*Info rule: size_ret always set, CL_INVALID_VALUE when param_value is too small.
inline cl_int Answer(size_t size, void* value, size_t* size_ret, const void* data, size_t n) {
  if (size_ret) *size_ret = n;
  if (value) {
    if (size < n) return CL_INVALID_VALUE;
    if (n) std::memcpy(value, data, n);
  }
  return CL_SUCCESS;
}
template <class T>
cl_int AnswerValue(size_t size, void* value, size_t* size_ret, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  return Answer(size, value, size_ret, &v, sizeof(T));
}
inline cl_int AnswerString(size_t size, void* value, size_t* size_ret, std::string_view s) {
  std::string z(s);
  return Answer(size, value, size_ret, z.c_str(), z.size() + 1);
}
template <class T>
cl_int AnswerArray(size_t size, void* value, size_t* size_ret, const std::vector<T>& v) {
  return Answer(size, value, size_ret, v.data(), v.size() * sizeof(T));
}

// ---- status mapping (only at the API edge) ----------------------------------------------

// Native OpenCL codes pass through; unknown handles become `unknown_handle`; a lost
// transport is logged (once per message) with the call that saw it.
cl_int ToCl(const Status& st, std::string_view call, cl_int unknown_handle = CL_INVALID_VALUE);

// Logs a warning the first time this exact message comes up (log::Once is only for
// unsupported entry points).
void WarnOnce(std::string msg);

inline void SetErr(cl_int* errcode_ret, cl_int err) {
  if (errcode_ret) *errcode_ret = err;
}

}  // namespace tandem::ocl

// ---- the objects -----------------------------------------------------------------------

struct _cl_platform_id {
  const cl_icd_dispatch* dispatch = &tandem::ocl::kDispatch;
};

struct _cl_device_id {
  const cl_icd_dispatch* dispatch = &tandem::ocl::kDispatch;
  tandem::client::Device* remote = nullptr;
  std::unordered_map<cl_device_info, std::vector<uint8_t>> info;  // answers, overrides applied
  // Limits parsed once for validation.
  cl_device_type type = CL_DEVICE_TYPE_DEFAULT;
  size_t max_work_group = 0;
  std::vector<size_t> max_item_sizes;
  cl_ulong max_alloc = 0;
  cl_uint base_align_bits = 8;
  cl_command_queue_properties queue_props = 0;

  tandem::client::Session& session() const { return *remote->session; }
};

struct _cl_context : tandem::ocl::Object<_cl_context> {
  using Notify = void(CL_CALLBACK*)(const char*, const void*, size_t, void*);
  std::vector<cl_device_id> devices;
  std::vector<cl_context_properties> properties;  // as given, 0-terminated (empty if none)
  Notify notify = nullptr;
  void* notify_data = nullptr;

  // Where buffers live for now: the first device's server. Memory objects keep their own
  // residency record so that per-device residency can come without changing callers.
  cl_device_id home() const { return devices.front(); }
  bool Has(cl_device_id d) const;
};

struct _cl_command_queue : tandem::ocl::Object<_cl_command_queue> {
  cl_context context = nullptr;
  cl_device_id device = nullptr;
  cl_command_queue_properties props = 0;
  std::vector<cl_queue_properties> prop_array;  // as given to ...WithProperties
  uint64_t stream = 0;

  // Reads whose data has not reached host memory yet: clFinish waits for them too.
  std::mutex mu;
  std::condition_variable cv;
  uint64_t host_next = 0;        // ids of those reads, in the order they began (HostOp)
  std::set<uint64_t> host_open;  // ids of those not landed yet

  // A mark for the reads begun so far, then a wait until all of those have landed (not the
  // ones begun after the mark, which may be held by a user event set only after the wait).
  uint64_t ReadsBegun() {
    std::lock_guard lock(mu);
    return host_next;
  }
  void WaitForReadsBefore(uint64_t mark) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return host_open.empty() || *host_open.begin() >= mark; });
  }

  tandem::client::Session& session() const { return device->session(); }
  bool profiling() const { return props & CL_QUEUE_PROFILING_ENABLE; }
  ~_cl_command_queue();
};

struct _cl_mem : tandem::ocl::Object<_cl_mem> {
  using Destructor = void(CL_CALLBACK*)(cl_mem, void*);
  struct Mapping {
    void* ptr = nullptr;
    size_t offset = 0, size = 0;
    cl_map_flags flags = 0;
    std::shared_ptr<uint8_t> staging;  // host copy (null when the buffer uses the host pointer)
  };

  cl_context context = nullptr;
  cl_mem_flags flags = 0;
  size_t size = 0;
  void* host_ptr = nullptr;  // CL_MEM_USE_HOST_PTR (a sub-buffer: parent's + origin)
  cl_mem parent = nullptr;   // sub-buffer: a view of parent at origin
  size_t origin = 0;
  // The home copy: the context's first device, whose server gets the buffer at creation,
  // and its remote handle.
  cl_device_id resident = nullptr;
  uint64_t handle = 0;
  // Residency across devices (root buffers only): one copy per device that has used the
  // buffer, copies[0] being the home copy. `current` copies hold the latest bytes. A copy out
  // of a server is read on that device's default stream, after the `writes` of the range it
  // reads (the events of the commands that wrote this copy: the program's, one of Tandem's own
  // when it asked for none, or the copy that brought the bytes here), the initial upload and
  // the copying command's wait-list events of that server; not in the order of the queue that
  // last wrote it, which would put it behind whatever that queue took since (a native copy on
  // another queue is not).
  //
  // A write of [lo, hi) of the root buffer, by the commands of `events`.
  struct Write {
    uint64_t lo = 0, hi = 0;
    std::vector<tandem::ocl::Held<_cl_event>> events;
  };
  struct Copy {
    tandem::client::Session* session = nullptr;
    uint32_t device = 0;  // the device's index on its server (a server keeps one copy per device)
    uint64_t handle = 0;
    // The writes since the last one of the whole buffer (that one first), oldest first. A copy
    // out of a range waits only for the writes that overlap it: halo rows copied into a band's
    // buffer must not hold up the copy of its other rows to the next neighbour (which would
    // chain the servers' halo exchanges one after another).
    std::vector<Write> writes;
    bool current = false;
  };
  std::mutex residency_mu;
  std::vector<Copy> copies;
  // The event of the initial upload (host-pointer buffers): the server runs it on its
  // default queue, so commands on other streams that touch the buffer wait for it.
  uint64_t ready = 0;

  std::mutex mu;
  std::vector<Mapping> maps;
  std::vector<std::pair<Destructor, void*>> destructors;
  // The queues whose commands have used it (AcquireBuffer), not kept alive by it: when it goes
  // with destructor callbacks set, those run once the commands these queues held at that moment
  // are done, as the object is deleted only once its queued commands are done.
  // With each queue its stream handle (unique): a queue deleted since, whose address a new
  // queue took, is told apart by it.
  std::vector<std::pair<cl_command_queue, uint64_t>> used_by;
  void NoteQueue(cl_command_queue q) {
    std::lock_guard lock(mu);
    const std::pair<cl_command_queue, uint64_t> key{q, q->stream};
    if (std::find(used_by.begin(), used_by.end(), key) == used_by.end()) used_by.push_back(key);
  }

  const _cl_mem* root() const { return parent ? parent : this; }
  uint64_t remote() const { return root()->handle; }
  uint64_t ready_event() const { return root()->ready; }
  tandem::client::Session& session() const { return root()->resident->session(); }
  ~_cl_mem();
};

struct _cl_program : tandem::ocl::Object<_cl_program> {
  // What one device has of the program: its module, build result and binary.
  struct PerDevice {
    cl_device_id device = nullptr;
    uint64_t module = 0;
    bool loaded = true;  // false once the server said it never created the module
    cl_build_status status = CL_BUILD_NONE;
    // What the last successful build, compile or link made (NONE: nothing yet; a program
    // from a binary is answered as an executable).
    cl_program_binary_type binary_type = CL_PROGRAM_BINARY_TYPE_NONE;
    std::string options, log;
    std::vector<tandem::ir::FunctionInfo> functions;
    std::optional<std::vector<uint8_t>> binary;  // fetched once (or given by the application)
  };
  cl_context context = nullptr;
  bool from_binary = false;
  bool from_source = false;  // clCreateProgramWithSource's (not a link's, not a binary's)
  std::string source;

  std::mutex mu;
  std::vector<PerDevice> per_device;  // in the order of the context's devices
  int kernels = 0;                    // kernel objects attached (blocks a rebuild)

  PerDevice* For(cl_device_id d);
  ~_cl_program();
};

struct _cl_kernel : tandem::ocl::Object<_cl_kernel> {
  struct Arg {
    bool set = false;
    tandem::ir::ArgKind kind = tandem::ir::ArgKind::kBytes;
    uint64_t value = 0;          // local size
    cl_mem mem = nullptr;        // buffer argument
    uint64_t ready = 0;          // its initial upload's event, waited for by launches
    uint64_t offset = 0, size = 0;  // a sub-buffer's range in its root buffer
    std::vector<uint8_t> data;   // bytes argument
  };
  cl_program program = nullptr;
  std::string name;
  tandem::ir::FunctionInfo info;                              // from the first built device
  std::vector<std::pair<cl_device_id, uint64_t>> functions;  // remote function per device
  std::vector<std::pair<cl_device_id, tandem::ir::FunctionInfo>> device_info;

  std::mutex mu;
  std::vector<Arg> args;

  const tandem::ir::FunctionInfo* InfoFor(cl_device_id d) const;
  uint64_t FunctionFor(cl_device_id d) const;
  ~_cl_kernel();
};

struct _cl_event : tandem::ocl::Object<_cl_event> {
  // Who learns that the event completed: the server (kRemote), the reply callback that put
  // read data into host memory (kHost) or clSetUserEventStatus (kUser).
  enum class Completion { kRemote, kHost, kUser };
  struct Callback {
    cl_int type;
    void(CL_CALLBACK* fn)(cl_event, cl_int, void*);
    void* data;
  };
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;  // null for user events
  cl_command_type type = 0;
  uint64_t handle = 0;  // remote event (the `signal` of its command)
  bool bound = false;   // a posted command signals it, so the server knows the handle
  // Tandem's own (a write in a context over several servers, a buffer's move between them):
  // the program has no handle to it.
  bool internal = false;
  Completion completion = Completion::kRemote;

  std::mutex mu;
  std::condition_variable cv;
  cl_int status = CL_QUEUED;
  bool watching = false;  // the callback watcher's EventQuery is out
  std::vector<Callback> callbacks;
  std::optional<std::array<cl_ulong, 4>> times;  // profiling, once complete
  // Stand-ins of this event on other servers, which wait lists there name (ImportedTo).
  tandem::client::StandIns imports;

  tandem::client::Session& session() const;
  ~_cl_event();
};

namespace tandem::ocl {

// ---- shared helpers (defined in the family files) ---------------------------------------

// platform_device.cc
cl_platform_id ThePlatform();
const std::vector<cl_device_id>& PlatformDevices();  // connects on first use
bool ValidDevice(cl_device_id d);

// events.cc
// A new event for a command of `queue` (or a user event when queue is null), with a fresh
// remote handle registered for routing asynchronous errors.
cl_event NewEvent(cl_context context, cl_command_queue queue, cl_command_type type,
                  _cl_event::Completion completion);
// Records a (lower) status; terminal ones wake waiters and schedule callbacks.
void SetEventStatus(cl_event e, cl_int status);
// Checks a wait list (CL_INVALID_EVENT_WAIT_LIST / CL_INVALID_CONTEXT) for a command of q.
// Wait-list events as remote handles of q's server: another server's event is named by its
// stand-in there (completed server to server), or, where direct links are off, waited for here.
// `foreign` gets those other servers' events: a copy from one of them waits for them there.
cl_int CheckWaitList(cl_command_queue q, cl_uint n, const cl_event* list, std::vector<uint64_t>* handles,
                     std::vector<cl_event>* foreign);
// The handles of those of `foreign` that belong to `session`.
std::vector<uint64_t> HandlesOn(const std::vector<cl_event>& foreign, const client::Session* session);

// How a command uses a buffer, for residency across servers (memory.cc).
enum class BufferUse {
  kRead,       // needs the current bytes
  kWrite,      // changes part of it: needs the current bytes, then only this server has them
  kOverwrite,  // replaces every byte: no copy needed first
};
// Makes `mem`'s bytes usable by a command on queue `q`: allocates a copy on q's server when
// it has none and, unless the command overwrites it all, brings the current bytes there
// from a server that has them (server to server; see client::CopyBetweenServers). Returns
// the root buffer's handle on q's server and adds to `wait` the events the command must wait
// for there (the initial upload). The source of such a copy first waits for the command's
// wait-list events of its own server (`foreign`, from CheckWaitList). A single-server context
// never copies anything.
// `writer` is the command's event: a writing use records it as a write of [lo, hi) of the
// root buffer on that copy.
cl_int AcquireBuffer(cl_command_queue q, cl_mem mem, BufferUse use, uint64_t* handle, std::vector<uint64_t>* wait,
                     const std::vector<cl_event>& foreign, cl_event writer, uint64_t lo, uint64_t hi);
// Whether the context's devices are on more than one server (buffers then move between them).
bool SpansServers(cl_context context);
// Whether q's server already holds the current bytes of `mem`.
bool CurrentOn(cl_command_queue q, cl_mem mem);
// Where the current bytes of `mem` are (another server than q's): the source end of a copy
// of the root's bytes [lo, hi), at the root's offset 0, waiting for the writes of that range.
client::CopyEnd CurrentSource(cl_mem mem, uint64_t lo, uint64_t hi);
// clWaitForEvents without the argument checks.
cl_int WaitEvents(const std::vector<cl_event>& events);
// Routes the server's deferred errors: to the event they signal, else to the log, and a
// failure of a command that wrote device memory with no event of the program's also to its
// queue's next clFinish or blocking read (TakeUnclaimedFailure).
void RouteAsyncErrors(client::Session& s);
// That failure of q's (CL_OUT_OF_RESOURCES, NVIDIA's code for a failed kernel), once, or CL_SUCCESS.
cl_int TakeUnclaimedFailure(cl_command_queue q);
// A queue's stream, from its creation to its release: only a live queue's failures are kept.
void NoteQueueStream(uint64_t stream);
void ForgetQueueStream(uint64_t stream);
// Runs fn on the front end's callback thread, in submission order.
void RunCallback(std::function<void()> fn);

// A synchronous command: waits for the reply, then routes deferred errors.
template <class Req>
Result<typename Req::Reply> CallOn(client::Session& s, const Req& req) {
  auto r = s.Call(req);
  RouteAsyncErrors(s);
  return r;
}

}  // namespace tandem::ocl
