// The CUDA backend: one session's commands on the driver API (see README.md). One primary
// context per device, retained on first use and made current on whichever thread runs the
// command; client handles map one to one onto driver objects.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_driver.h"
#include "cuda_output.h"
#include "tandem/server/backend.h"

namespace tandem::server::cuda {

class CudaBackend final : public Backend {
 public:
  // Pinned staging for bulk transfers: kSlots chunks of kChunk bytes per device, so the
  // network and the GPU copy overlap (the worker's BulkIO uses the same chunk size).
  static constexpr size_t kSlots = 4;
  static constexpr size_t kChunk = 4u << 20;

  CudaBackend(const Driver* driver, std::vector<CUdevice> devices, std::unique_ptr<OutputCapture> output);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  uint32_t device_count() const override { return static_cast<uint32_t>(devices_.size()); }
  std::vector<std::pair<uint32_t, std::string>> TakeOutput() override;
  // Pinned, from the same pool as the peer staging: a read to the client is copied by the
  // device straight into the chunk the network sends.
  Result<std::shared_ptr<HostBuffer>> BulkStaging(size_t n) override;

  // Devices (cuda_backend.cc)
  Status OnDeviceInfo(const ir::DeviceInfoReq&, ir::DeviceInfoRep*) override;
  Status OnDeviceSync(const ir::DeviceSyncReq&, ir::DeviceSyncRep*) override;
  Status OnMemInfo(const ir::MemInfoReq&, ir::MemInfoRep*) override;
  Status OnPriorityRange(const ir::PriorityRangeReq&, ir::PriorityRangeRep*) override;
  Status OnDeviceSetLimit(const ir::DeviceSetLimitReq&, ir::DeviceSetLimitRep*) override;
  Status OnDeviceGetLimit(const ir::DeviceGetLimitReq&, ir::DeviceGetLimitRep*) override;
  Status OnDeviceSetCacheConfig(const ir::DeviceSetCacheConfigReq&, ir::DeviceSetCacheConfigRep*) override;
  Status OnWarm(const ir::WarmReq&, ir::WarmRep*) override;
  Status OnDeviceReset(const ir::DeviceResetReq&, ir::DeviceResetRep*) override;
  // Memory (cuda_memory.cc, cuda_transfer.cc)
  Status OnAddressReserve(const ir::AddressReserveReq&, ir::AddressReserveRep*) override;
  Status OnBufferAlloc(const ir::BufferAllocReq&, ir::BufferAllocRep*) override;
  Status OnBufferFree(const ir::BufferFreeReq&, ir::BufferFreeRep*) override;
  Status OnBufferWrite(const ir::BufferWriteReq&, ir::BufferWriteRep*) override;
  Status OnBufferRead(const ir::BufferReadReq&, ir::BufferReadRep*) override;
  Status OnBufferCopy(const ir::BufferCopyReq&, ir::BufferCopyRep*) override;
  Status OnBufferFill(const ir::BufferFillReq&, ir::BufferFillRep*) override;
  Status OnBufferCopyRect(const ir::BufferCopyRectReq&, ir::BufferCopyRectRep*) override;
  // Modules and functions (cuda_module.cc)
  Status OnModuleLoad(const ir::ModuleLoadReq&, ir::ModuleLoadRep*) override;
  Status OnModuleBuild(const ir::ModuleBuildReq&, ir::ModuleBuildRep*) override;
  Status OnModuleFree(const ir::ModuleFreeReq&, ir::ModuleFreeRep*) override;
  Status OnModuleGlobal(const ir::ModuleGlobalReq&, ir::ModuleGlobalRep*) override;
  Status OnFunctionGet(const ir::FunctionGetReq&, ir::FunctionGetRep*) override;
  Status OnFunctionFree(const ir::FunctionFreeReq&, ir::FunctionFreeRep*) override;
  Status OnFunctionSetAttr(const ir::FunctionSetAttrReq&, ir::FunctionSetAttrRep*) override;
  Status OnFunctionSetCacheConfig(const ir::FunctionSetCacheConfigReq&, ir::FunctionSetCacheConfigRep*) override;
  Status OnOccupancy(const ir::OccupancyReq&, ir::OccupancyRep*) override;
  // Launch (cuda_launch.cc)
  Status OnLaunch(const ir::LaunchReq&, ir::LaunchRep*) override;
  // Streams and events (cuda_events.cc)
  Status OnStreamCreate(const ir::StreamCreateReq&, ir::StreamCreateRep*) override;
  Status OnStreamDestroy(const ir::StreamDestroyReq&, ir::StreamDestroyRep*) override;
  Status OnStreamSync(const ir::StreamSyncReq&, ir::StreamSyncRep*) override;
  Status OnMarker(const ir::MarkerReq&, ir::MarkerRep*) override;
  Status OnEventCreate(const ir::EventCreateReq&, ir::EventCreateRep*) override;
  Status OnEventDestroy(const ir::EventDestroyReq&, ir::EventDestroyRep*) override;
  Status OnEventQuery(const ir::EventQueryReq&, ir::EventQueryRep*) override;
  Status OnEventWait(const ir::EventWaitReq&, ir::EventWaitRep*) override;
  Status OnEventElapsed(const ir::EventElapsedReq&, ir::EventElapsedRep*) override;
  Status OnUserEventSet(const ir::UserEventSetReq&, ir::UserEventSetRep*) override;
  Status NotifyWhenDone(uint64_t event, std::function<void(int32_t status)> done) override;
  Status ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                    uint64_t signal, std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) override;
  Result<PendingWrite> WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                     const ir::u64s& wait, uint64_t signal) override;

  struct PinnedPool;  // cuda_async.cc

 private:
  // Pinned host words that user events hold streams on. Words are never reused (a stream
  // may still be waiting on a destroyed event's word), so pages only grow.
  struct UserFlagPages {
    std::vector<uint32_t*> pages;
    size_t used_in_last = 0;
  };
  struct Device {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;   // the primary context, retained on first use
    uint64_t granularity = 0;  // VMM allocation granularity (minimum)
    Status sticky;             // a sticky error: every later command on the device reports it
    std::shared_ptr<HostBuffer> staging;  // from the pinned pool, like the two below
    std::array<CUevent, kSlots> slot_done{};  // the last copy that used each staging slot
    // Inline reads (up to ir::kInlineDataLimit) land here, then are copied into the reply:
    // used only by the executor within one read.
    std::shared_ptr<HostBuffer> read_buffer;
    bool read_buffer_failed = false;  // pinning failed once: read into the reply
    UserFlagPages flags;
    // Keepalive (OnWarm): its own stream, an empty kernel and a small device scratch
    // (a module global), created with the context (LoadWarm); warm_error when that failed.
    CUstream warm_stream = nullptr;
    CUmodule warm_module = nullptr;
    CUfunction warm_kernel = nullptr;
    CUdeviceptr warm_scratch = 0;
    Status warm_error;
    // Cross-server event waits (NotifyWhenDone): a stream of its own waits on each exported
    // event and then runs a host callback, created on first use.
    CUstream notify_stream = nullptr;
  };
  struct Reservation {
    uint32_t device;
    uint64_t size;
  };
  struct Allocation {
    uint32_t device;
    uint64_t address;
    uint64_t size;    // as asked
    uint64_t mapped;  // rounded up to the granularity
    CUmemGenericAllocationHandle mem;
  };
  // A range of device memory that absolute addressing (buffer == 0) may touch.
  struct Range {
    uint64_t end;
    uint32_t device;
  };
  struct Module {
    uint32_t device;
    CUmodule mod;
    std::vector<uint64_t> globals;  // starts of its ranges in ranges_
  };
  struct Function {
    uint64_t module;
    uint32_t device;
    CUfunction fn;
    std::string name;
    std::vector<ir::ParamInfo> params;
  };
  struct Stream {
    uint32_t device;
    CUstream stream;
  };
  struct Event {
    uint32_t device;
    CUevent event;
  };
  // A user event: the pinned word streams wait on, and the status UserEventSet gave it.
  struct UserEvent {
    uint32_t device;
    uint32_t* word;
    int32_t status = kNotSet;
    static constexpr int32_t kNotSet = INT32_MIN;
  };
  // Where an enqueued command runs.
  struct Queue {
    uint32_t device;
    CUstream stream;
  };
  // A resolved piece of device memory.
  struct Span {
    uint32_t device;
    CUdeviceptr address;
  };

  // cuda_backend.cc: device access and errors.
  Status CheckDevice(uint64_t device) const;
  // Makes the device's context current on this thread (retaining it on first use); fails
  // with the device's sticky error once it has one.
  Status Enter(uint32_t device);
  // The keepalive's stream and module, made right after the context (cuda_warm.cc).
  void LoadWarm(uint32_t device);
  // Driver result of a call on `device`: a sticky error is remembered for the device.
  Status Check(uint32_t device, CUresult r, std::string_view call);
  // Frees the session's resources on the device and releases its context; reservations too
  // unless `keep_reservations` (DeviceReset keeps the client's address ranges). Returns the
  // pinned blocks it unpinned (see Unpin).
  std::vector<uint8_t*> ReleaseDevice(uint32_t device, bool keep_reservations);
  void Forget(const char* what, uint32_t device, CUresult r);

  // cuda_memory.cc
  Result<Span> Resolve(uint64_t buffer, uint64_t offset, uint64_t size, const char* what) const;
  Status MapAllocation(uint64_t buffer, const ir::BufferAllocReq& req);
  Status FreeAllocation(const Allocation& a);
  Status Reserve(uint32_t device, uint64_t base, uint64_t size);
  Status Granularity(uint32_t device, uint64_t* granularity);

  // cuda_transfer.cc: pinned staging.
  uint8_t* ReadBuffer(uint32_t device);
  Status Staging(uint32_t device, uint8_t** slots);
  Status WriteFromClient(const Queue& q, CUdeviceptr dst, const ir::BufferWriteReq& req);
  Status ReadToClient(const Queue& q, CUdeviceptr src, const ir::BufferReadReq& req);

  // cuda_events.cc: streams and the wait/signal fields of every enqueue.
  Result<Queue> ResolveStream(uint64_t stream, uint32_t device_of_default);
  Status WaitEvents(const Queue& q, const std::vector<uint64_t>& wait);
  // Whether the command may signal `signal` on q (0: nothing to signal, answered nullptr): an
  // event of this session on q's device, not a user event; its CUevent. Asked before anything
  // is enqueued, so that a command that fails for its signal has done nothing.
  Result<CUevent> CheckSignal(const Queue& q, uint64_t signal);
  // The wait list enqueued on q, once the signal is known good.
  Status WaitEvents(const Queue& q, const std::vector<uint64_t>& wait, uint64_t signal) {
    TANDEM_RETURN_IF_ERROR(CheckSignal(q, signal).status());
    return WaitEvents(q, wait);
  }
  Status Signal(const Queue& q, uint64_t signal);
  bool IsUserEvent(uint64_t event);
  // The device of an event, real or user (`what` names the command in the error).
  Result<uint32_t> EventDevice(uint64_t event, const char* what);
  Result<uint32_t*> NewUserFlag(uint32_t device);
  Status WaitUserFlag(const Queue& q, uint32_t* flag);
  void ReleaseUserFlags(uint32_t device);

  // cuda_module.cc
  Status DescribeFunction(const Function& f, ir::FunctionInfo* info);

  // cuda_async.cc: completions reported by host callbacks, pinned buffers of async transfers.
  Status CallWhenDone(const Queue& q, std::optional<uint64_t> event, std::function<void(int32_t)> fn);
  struct PeerStart {
    CUdeviceptr address;
    Queue queue;
    std::shared_ptr<HostBuffer> host;
  };
  Result<PeerStart> StartPeer(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                              uint64_t signal, const char* what);
  // After a failure that leaves a copy touching `host` enqueued on q: the block is kept for
  // good rather than handed out under a live copy (q may be held by a user event for as long as
  // the program likes: the executor does not wait for it). A driver failure path only.
  static void Keep(uint32_t device, std::shared_ptr<HostBuffer> host);
  // Host memory of at least n bytes from the pinned pool, pinned under the device's context.
  Result<std::shared_ptr<HostBuffer>> Pinned(uint32_t device, size_t n);
  Status Pin(uint32_t device, uint8_t* p, size_t n);
  std::vector<uint8_t*> Unpin(uint32_t device);
  void Repin(uint32_t device, const std::vector<uint8_t*>& blocks);
  // Whether [p, p + n) lies in one pinned buffer of the pool.
  bool IsPinned(const void* p, size_t n) const;

  const Driver* drv_;
  std::vector<Device> devices_;
  std::unique_ptr<OutputCapture> output_;
  std::map<uint64_t, Reservation> reservations_;  // by base address
  std::unordered_map<uint64_t, Allocation> buffers_;
  std::map<uint64_t, Range> ranges_;  // by start address: live allocations and module globals
  std::unordered_map<uint64_t, Module> modules_;
  std::unordered_map<uint64_t, Function> functions_;
  std::unordered_set<uint64_t> orphaned_functions_;  // their module was freed before them
  std::unordered_map<uint64_t, Stream> streams_;
  std::unordered_map<uint64_t, Event> events_;
  // UserEventSet is urgent: the worker's receive thread runs it beside the executor (see
  // backend.h), so user events live apart, under user_mu_; user_cv_ wakes EventWait.
  std::mutex user_mu_;
  std::condition_variable user_cv_;
  std::unordered_map<uint64_t, UserEvent> user_events_;
  std::shared_ptr<PinnedPool> pinned_;
};

// Parses BackendOptions::devices ("0,2") against the driver's device count.
Result<std::vector<CUdevice>> SelectDevices(const Driver& drv, const std::string& filter);

}  // namespace tandem::server::cuda
