// Tier 2: the OpenCL backend in process, on PoCL: memory commands, programs from source
// and binary, launches with every argument kind, events and profiling, RMA through a
// chunked in-memory BulkIO, and the validation every wire field gets.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <set>
#include <thread>

#include "opencl_backend.h"
#include "tandem/server/backend.h"

namespace tandem::server {
namespace {

// A BulkIO whose "client memory" is this process: Region.addr is a host pointer. Small
// chunks make every transfer go through several of them.
class MemoryBulk : public BulkIO {
 public:
  static constexpr size_t kChunk = 1000;
  int chunks = 0;
  Status Pull(const ir::Region& remote, size_t len,
              const std::function<Status(const uint8_t*, size_t, size_t)>& sink) override {
    if (len > remote.len) return Status::Invalid("too long");
    const auto* src = reinterpret_cast<const uint8_t*>(remote.addr);
    for (size_t off = 0; off < len; off += kChunk, ++chunks) {
      std::vector<uint8_t> staging(src + off, src + off + std::min(kChunk, len - off));
      TANDEM_RETURN_IF_ERROR(sink(staging.data(), off, staging.size()));
    }
    return Status::Ok();
  }
  Status Push(const ir::Region& remote, size_t len,
              const std::function<Status(uint8_t*, size_t, size_t)>& source) override {
    if (len > remote.len) return Status::Invalid("too long");
    auto* dst = reinterpret_cast<uint8_t*>(remote.addr);
    for (size_t off = 0; off < len; off += kChunk, ++chunks) {
      std::vector<uint8_t> staging(std::min(kChunk, len - off));
      TANDEM_RETURN_IF_ERROR(source(staging.data(), off, staging.size()));
      std::memcpy(dst + off, staging.data(), staging.size());
    }
    return Status::Ok();
  }
};

ir::bytes Bytes(const std::string& s) { return ir::bytes(s.begin(), s.end()); }
template <class T>
ir::bytes ValueBytes(const T& v) {
  ir::bytes b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

class OpenCLBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = MakeOpenCLBackend(BackendOptions{});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    be_ = std::move(b.value());
    be_->set_bulk(&bulk_);
  }

  void Alloc(uint64_t h, uint64_t size) {
    ir::BufferAllocRep rep;
    ASSERT_TRUE(be_->OnBufferAlloc({h, 0, size, 0, 0}, &rep).ok());
  }
  Status Write(uint64_t h, uint64_t off, const ir::bytes& data, ir::u64s wait = {}, uint64_t signal = 0) {
    ir::BufferWriteRep rep;
    return be_->OnBufferWrite({0, h, off, data.size(), data, {}, std::move(wait), signal}, &rep);
  }
  ir::bytes Read(uint64_t h, uint64_t off, uint64_t size) {
    ir::BufferReadRep rep;
    Status st = be_->OnBufferRead({0, h, off, size, {}, {}, 0}, &rep);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rep.data;
  }
  ir::ModuleBuildRep Build(uint64_t module, const std::string& src, const std::string& options = "") {
    ir::ModuleLoadRep lrep;
    EXPECT_TRUE(
        be_->OnModuleLoad({module, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLSource), Bytes(src)}, &lrep).ok());
    ir::ModuleBuildRep rep;
    Status st = be_->OnModuleBuild({module, options}, &rep);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rep;
  }

  // A launch of a kernel that runs for tens of milliseconds on PoCL (20 M iterations of an LCG,
  // the result in out[0]): module 70, function 71, on the default queue; `out` is made here
  // (64 bytes).
  void SpinLaunch(uint64_t out, ir::LaunchReq* spin) {
    ASSERT_EQ(Build(70, R"CLC(
__kernel void spin(__global int* out, int n) {
  int x = 1;
  for (int i = 0; i < n; ++i) x = x * 1664525 + 1013904223;
  out[0] = x;
})CLC")
                  .status,
              CL_SUCCESS);
    ir::FunctionGetRep frep;
    ASSERT_TRUE(be_->OnFunctionGet({71, 70, "spin"}, &frep).ok());
    Alloc(out, 64);
    spin->function = 71;
    spin->dims = 1;
    spin->grid = {1};
    const int32_t iterations = 20'000'000;
    const auto* n_bytes = reinterpret_cast<const uint8_t*>(&iterations);
    spin->args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), out, {}},
                  {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ir::bytes(n_bytes, n_bytes + 4)}};
  }

  // A synchronize of `stream` whose reply is deferred (the wait not next), for the caller to
  // run on another thread as the worker's waiter does; null if none was deferred. Leaves
  // deferred replies allowed.
  DeferredWait DeferredStreamSync(uint64_t stream) {
    be_->AllowDeferredReplies(true);
    be_->set_wait_runs_next(false);
    ir::StreamSyncRep ss;
    Status st = be_->OnStreamSync({stream}, &ss);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return be_->TakeDeferredReply();
  }

  MemoryBulk bulk_;
  std::unique_ptr<Backend> be_;
};

TEST_F(OpenCLBackendTest, DeviceInfoCarriesRawProperties) {
  ASSERT_GE(be_->device_count(), 1u);
  ir::DeviceInfoRep rep;
  ASSERT_TRUE(be_->OnDeviceInfo({0}, &rep).ok());
  EXPECT_EQ(rep.api, static_cast<uint32_t>(Api::kOpenCL));
  EXPECT_FALSE(rep.name.empty());
  bool name = false, type = false, platform = false, handle = false;
  for (const auto& p : rep.props) {
    if (p.key == CL_DEVICE_NAME) name = std::string(p.value.begin(), p.value.end() - 1) == rep.name;
    if (p.key == CL_DEVICE_TYPE) type = p.value.size() == sizeof(cl_device_type);
    if (p.key == CL_PLATFORM_NAME) platform = true;
    if (p.key == CL_DEVICE_PLATFORM) handle = true;
  }
  EXPECT_TRUE(name && type && platform);
  EXPECT_FALSE(handle);
  EXPECT_EQ(be_->OnDeviceInfo({99}, &rep).code(), Code::kInvalidArgument);
}

TEST_F(OpenCLBackendTest, WriteReadCopyFillRect) {
  Alloc(1, 4096);
  Alloc(2, 4096);
  ir::bytes data(1024);
  std::iota(data.begin(), data.end(), 0);
  ASSERT_TRUE(Write(1, 100, data).ok());
  EXPECT_EQ(Read(1, 100, 1024), data);

  ir::BufferCopyRep crep;
  ASSERT_TRUE(be_->OnBufferCopy({0, 1, 100, 2, 0, 1024, {}, 0}, &crep).ok());
  EXPECT_EQ(Read(2, 0, 1024), data);

  ir::BufferFillRep frep;
  ASSERT_TRUE(be_->OnBufferFill({0, 2, 2048, 64, {0xAB, 0xCD}, {}, 0}, &frep).ok());
  ir::bytes filled = Read(2, 2048, 64);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(filled[i], i % 2 ? 0xCD : 0xAB);

  // A 4x3 rectangle from rows of 16 bytes at (2,1) to rows of 8 bytes at (0,0).
  Alloc(3, 256);
  Alloc(4, 256);
  ir::bytes src(256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i % 251);
  ASSERT_TRUE(Write(3, 0, src).ok());
  ASSERT_TRUE(Write(4, 0, ir::bytes(256, 0)).ok());
  ir::BufferCopyRectRep rrep;
  Status st = be_->OnBufferCopyRect({0, 3, 4, {2, 1, 0}, {0, 0, 0}, {4, 3, 1}, {16, 0, 8, 0}, {}, 0}, &rrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ir::bytes rect = Read(4, 0, 24);
  for (size_t y = 0; y < 3; ++y)
    for (size_t x = 0; x < 4; ++x) EXPECT_EQ(rect[y * 8 + x], src[(1 + y) * 16 + 2 + x]) << x << "," << y;
}

// Small reads land in the device's mapped read slots and are copied into the reply when
// the waiter runs. More reads in flight than slots: the rest read straight into their reply;
// a read over a slot's size too. Each gets its own bytes, also after the slots came back.
TEST_F(OpenCLBackendTest, DeferredReadsThroughSlotsAndPastThem) {
  constexpr size_t kBig = (64u << 10) + 3;
  Alloc(1, 1 << 20);
  ir::bytes data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 7) ^ (i >> 9));
  ASSERT_TRUE(Write(1, 0, data).ok());
  be_->AllowDeferredReplies(true);
  for (int round = 0; round < 2; ++round) {
    struct Pending {
      uint64_t offset, size;
      std::unique_ptr<ir::BufferReadRep> rep;
      std::function<Status()> wait;
    };
    std::vector<Pending> pending;
    for (uint64_t i = 0; i < 20; ++i) {
      const uint64_t size = i == 5 ? kBig : 8 + i * 100, offset = i * 4099 + round;
      auto rep = std::make_unique<ir::BufferReadRep>();
      ASSERT_TRUE(be_->OnBufferRead({0, 1, offset, size, {}, {}, 0}, rep.get()).ok());
      auto wait = be_->TakeDeferredReply();
      ASSERT_TRUE(wait) << "read " << i << " was not deferred";
      pending.push_back({offset, size, std::move(rep), std::move(wait)});
    }
    // Waited for in reverse: a slot's bytes belong to its own read, whatever the order.
    // Every wait runs (no ASSERT here), so no read is left writing into a freed reply.
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
      const Status st = it->wait();
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok() || it->rep->data.size() != it->size) continue;
      EXPECT_TRUE(std::equal(it->rep->data.begin(), it->rep->data.end(), data.begin() + it->offset))
          << "round " << round << ": read at " << it->offset << " of " << it->size;
    }
  }
  be_->AllowDeferredReplies(false);
}

// Keepalive: Warm echoes its bytes through the device (a write and a read back), runs the
// empty kernel, or both; its wait is deferred to the waiter like a program's read back, and
// the request's bytes may be gone by then. Without deferral it finishes at once.
TEST_F(OpenCLBackendTest, WarmEchoesThroughTheDeviceDeferredAndNot) {
  for (bool deferred : {true, false}) {
    be_->AllowDeferredReplies(deferred);
    for (uint32_t what : {ir::kWarmCopy, ir::kWarmKernel, ir::kWarmCopy | ir::kWarmKernel}) {
      for (int i = 0; i < 3; ++i) {
        auto req = std::make_unique<ir::WarmReq>();
        req->device = 0;
        req->what = what;
        req->data = ir::bytes(ir::kWarmMaxBytes);
        for (size_t k = 0; k < req->data.size(); ++k) req->data[k] = static_cast<uint8_t>(k * 13 + i + what);
        const ir::bytes sent = req->data;
        ir::WarmRep rep;
        ASSERT_TRUE(be_->OnWarm(*req, &rep).ok()) << "what " << what;
        req.reset();  // the wait must not need the request any more
        auto wait = be_->TakeDeferredReply();
        ASSERT_EQ(static_cast<bool>(wait), deferred) << "what " << what;
        if (wait) {
          const Status st = wait();
          ASSERT_TRUE(st.ok()) << st.ToString();
        }
        if (what & ir::kWarmCopy) {
          EXPECT_EQ(rep.data, sent) << "what " << what << ", round " << i;
        } else {
          EXPECT_TRUE(rep.data.empty());
        }
      }
    }
  }
  be_->AllowDeferredReplies(false);
  ir::WarmRep rep;
  EXPECT_FALSE(be_->OnWarm({.device = 7, .what = ir::kWarmCopy, .spin_us = 0, .data = ir::bytes(8)}, &rep).ok());
}

// With every read slot held by reads in flight, Warm reads straight into its reply; the
// reads that held the slots still get their own bytes.
TEST_F(OpenCLBackendTest, WarmWithoutAFreeReadSlot) {
  Alloc(1, 4096);
  ir::bytes data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 5 + 1);
  ASSERT_TRUE(Write(1, 0, data).ok());
  be_->AllowDeferredReplies(true);
  struct Held {
    std::unique_ptr<ir::BufferReadRep> rep;
    std::function<Status()> wait;
  };
  std::vector<Held> held;
  for (uint64_t i = 0; i < opencl::ReadSlots::kSlots; ++i) {
    auto rep = std::make_unique<ir::BufferReadRep>();
    ASSERT_TRUE(be_->OnBufferRead({0, 1, i * 64, 64, {}, {}, 0}, rep.get()).ok());
    auto wait = be_->TakeDeferredReply();
    ASSERT_TRUE(wait);
    held.push_back({std::move(rep), std::move(wait)});
  }
  ir::WarmReq req{.device = 0, .what = ir::kWarmCopy | ir::kWarmKernel, .spin_us = 0, .data = ir::bytes(ir::kWarmMaxBytes)};
  for (size_t k = 0; k < req.data.size(); ++k) req.data[k] = static_cast<uint8_t>(200 - k);
  ir::WarmRep rep;
  ASSERT_TRUE(be_->OnWarm(req, &rep).ok());
  auto wait = be_->TakeDeferredReply();
  ASSERT_TRUE(wait);
  const Status st = wait();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(rep.data, req.data);
  for (uint64_t i = 0; i < held.size(); ++i) {
    const Status r = held[i].wait();
    EXPECT_TRUE(r.ok()) << r.ToString();
    EXPECT_TRUE(std::equal(held[i].rep->data.begin(), held[i].rep->data.end(), data.begin() + i * 64)) << "read " << i;
  }
  be_->AllowDeferredReplies(false);
}

// When a deferred synchronize is the waiter's next action, the executor leaves the first
// queue it finishes unflushed, and its wait, run on another thread as the waiter runs it,
// must flush it: once that wait returns, what came before it is complete (queried without
// any other flush): a kernel that runs for tens of milliseconds and copies, on the default
// queue and on a stream; and a read back sees the copied bytes. Both waits: clFinish, when
// the client waits alone (in place), and a marker's event otherwise.
TEST_F(OpenCLBackendTest, WaitThatRunsNextFlushesItsOwnQueue) {
  Alloc(1, 4096);
  Alloc(2, 4096);
  Alloc(3, 4096);
  ir::LaunchReq spin;
  ASSERT_NO_FATAL_FAILURE(SpinLaunch(4, &spin));
  ir::bytes data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(Write(1, 0, data).ok());
  ir::StreamCreateRep screp;
  ASSERT_TRUE(be_->OnStreamCreate({50, 0, 0, 0}, &screp).ok());
  be_->AllowDeferredReplies(true);
  // The reply the last command deferred, waited for on another thread as the waiter does.
  auto deferred_elsewhere = [&] {
    auto wait = be_->TakeDeferredReply();
    if (!wait) return Status(Code::kInternal, "the command deferred no reply");
    Status st;
    std::thread([&] { st = wait(); }).join();
    return st;
  };
  auto complete = [&](uint64_t event) {
    ir::EventQueryRep q;
    EXPECT_TRUE(be_->OnEventQuery({event}, &q).ok());
    return q.status == CL_COMPLETE;
  };
  for (uint64_t round = 0; round < 4; ++round) {
    const bool alone = round % 2 == 1;
    const uint64_t on_default = 100 + 10 * round, on_stream = on_default + 1, again = on_default + 2;
    const uint64_t spun = on_default + 3;
    be_->set_wait_runs_next(false);
    spin.signal = spun;
    ir::LaunchRep lrep;
    ASSERT_TRUE(be_->OnLaunch(spin, &lrep).ok());
    ir::BufferCopyRep crep;
    ASSERT_TRUE(be_->OnBufferCopy({0, 1, 0, 2, 0, 4096, {}, on_default}, &crep).ok());
    ASSERT_TRUE(be_->OnBufferCopy({50, 1, 0, 3, 0, 4096, {}, on_stream}, &crep).ok());
    // The device's queues, the default one first: that one is left to the wait.
    be_->set_wait_runs_next(true);
    be_->set_caller_waits_alone(alone);
    ir::DeviceSyncRep dsrep;
    ASSERT_TRUE(be_->OnDeviceSync({0}, &dsrep).ok());
    be_->set_caller_waits_alone(false);
    Status st = deferred_elsewhere();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(complete(spun)) << "round " << round;
    EXPECT_TRUE(complete(on_default)) << "round " << round;
    EXPECT_TRUE(complete(on_stream)) << "round " << round;

    // One stream's synchronize: its only queue is left to the wait.
    be_->set_wait_runs_next(false);
    spin.stream = 50;
    spin.signal = spun + 1;
    ASSERT_TRUE(be_->OnLaunch(spin, &lrep).ok());
    spin.stream = 0;
    ASSERT_TRUE(be_->OnBufferCopy({50, 2, 0, 3, 0, 4096, {}, again}, &crep).ok());
    be_->set_wait_runs_next(true);
    be_->set_caller_waits_alone(alone);
    ir::StreamSyncRep ssrep;
    ASSERT_TRUE(be_->OnStreamSync({50}, &ssrep).ok());
    be_->set_caller_waits_alone(false);
    st = deferred_elsewhere();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(complete(spun + 1)) << "round " << round;
    EXPECT_TRUE(complete(again)) << "round " << round;

    be_->set_wait_runs_next(false);
    ir::BufferReadRep rep;
    ASSERT_TRUE(be_->OnBufferRead({0, 3, 64 * round, 64, {}, {}, 0}, &rep).ok());
    st = deferred_elsewhere();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(std::equal(rep.data.begin(), rep.data.end(), data.begin() + 64 * round)) << "round " << round;
  }
  be_->AllowDeferredReplies(false);
  ir::StreamDestroyRep sdrep;
  EXPECT_TRUE(be_->OnStreamDestroy({50}, &sdrep).ok());
}

// A command whose wait list holds an event that has already failed is not enqueued (PoCL
// 3.1 and 5.0 would leave it queued forever, and a wait on it with it): it fails at once, whether
// that event is a user event set to an error or a command that failed with one.
TEST_F(OpenCLBackendTest, CommandAfterAFailedEventFailsInsteadOfHanging) {
  Alloc(1, 64);
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({80, 0, ir::kEventUser}, &erep).ok());
  ir::MarkerRep mrep;
  ASSERT_TRUE(be_->OnMarker({0, 0, {80}, 81}, &mrep).ok());  // enqueued before the failure: fails with it
  ir::UserEventSetRep urep;
  ASSERT_TRUE(be_->OnUserEventSet({80, -42}, &urep).ok());
  ir::EventWaitRep wrep;
  ASSERT_TRUE(be_->OnEventWait({{81}}, &wrep).ok());
  ASSERT_EQ(wrep.statuses.size(), 1u);
  EXPECT_LT(wrep.statuses[0], 0);
  for (uint64_t failed : {80, 81}) {
    ir::BufferWriteRep w;
    Status st = be_->OnBufferWrite({0, 1, 0, 4, {1, 2, 3, 4}, {}, {failed}, 82}, &w);
    EXPECT_EQ(st.native(), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) << "after event " << failed << ": " << st.ToString();
    ir::MarkerRep m;
    st = be_->OnMarker({0, 1, {failed}, 0}, &m);
    EXPECT_EQ(st.native(), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) << "after event " << failed << ": " << st.ToString();
  }
  // Nothing was left queued: the default queue still serves.
  ASSERT_TRUE(Write(1, 0, {9, 9, 9, 9}).ok());
  EXPECT_EQ(Read(1, 0, 4), (ir::bytes{9, 9, 9, 9}));
}

// A wait event failed from another thread (the receive thread's UserEventSet) just as a
// command is prepared, after the look at its status and before its enqueue: the failure
// waits for the enqueue, so the command fails with the event instead of staying queued for
// good (PoCL), and later commands still run.
TEST_F(OpenCLBackendTest, WaitEventFailedDuringTheEnqueueStillEndsTheCommand) {
  Alloc(1, 64);
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({90, 0, ir::kEventUser}, &erep).ok());
  auto* ocl = dynamic_cast<opencl::OpenCLBackend*>(be_.get());
  ASSERT_NE(ocl, nullptr);
  std::thread setter;
  Status set;
  ocl->set_after_wait_check_for_test([&] {
    if (setter.joinable()) return;  // the marker's preparation only
    setter = std::thread([&] {
      ir::UserEventSetRep urep;
      set = be_->OnUserEventSet({90, -42}, &urep);
    });
    // Time enough for the other thread to set the failure, unless it has to wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  ir::MarkerRep mrep;
  Status marked = be_->OnMarker({0, 0, {90}, 91}, &mrep);
  ocl->set_after_wait_check_for_test(nullptr);
  ASSERT_TRUE(setter.joinable());
  setter.join();
  ASSERT_TRUE(set.ok()) << set.ToString();
  ASSERT_TRUE(marked.ok()) << marked.ToString();
  // Queried, not waited for: a marker left queued would hang a wait.
  ir::EventQueryRep q;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    ASSERT_TRUE(be_->OnEventQuery({91}, &q).ok());
    if (q.status < 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_LT(q.status, 0) << "the marker never ended: enqueued after its wait event had failed";
  ASSERT_TRUE(Write(1, 0, {7, 7, 7, 7}).ok());
  EXPECT_EQ(Read(1, 0, 4), (ir::bytes{7, 7, 7, 7}));
}

// The same window for a server-to-server transfer's gate: the bytes' arrival (here, a lost
// source) fails the gate on another thread while the executor enqueues a command that waits on
// the transfer. The gate fails under the same lock, so the marker is enqueued first and fails
// with the transfer instead of staying queued for good (PoCL).
TEST_F(OpenCLBackendTest, TransferGateFailedDuringTheEnqueueStillEndsTheCommand) {
  Alloc(1, 64);
  auto* ocl = dynamic_cast<opencl::OpenCLBackend*>(be_.get());
  ASSERT_NE(ocl, nullptr);
  auto pending = be_->WriteFromHost(0, 1, 0, 64, {}, 95);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  std::thread releaser;
  ocl->set_after_wait_check_for_test([&] {
    if (releaser.joinable()) return;
    releaser = std::thread([&] { pending->release(Status(Code::kLinkLost, "test: the source server went away")); });
    // Time enough for the other thread to fail the gate, unless it has to wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  ir::MarkerRep mrep;
  Status marked = be_->OnMarker({0, 0, {95}, 96}, &mrep);
  ocl->set_after_wait_check_for_test(nullptr);
  ASSERT_TRUE(releaser.joinable());
  releaser.join();
  ASSERT_TRUE(marked.ok()) << marked.ToString();
  ir::EventQueryRep q;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    ASSERT_TRUE(be_->OnEventQuery({96}, &q).ok());
    if (q.status < 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_LT(q.status, 0) << "the marker never ended: enqueued after the transfer's gate had failed";
  ASSERT_TRUE(be_->OnEventQuery({95}, &q).ok());
  EXPECT_LT(q.status, 0) << "the transfer did not fail with its gate";
  ASSERT_TRUE(Write(1, 0, {7, 7, 7, 7}).ok());
  EXPECT_EQ(Read(1, 0, 4), (ir::bytes{7, 7, 7, 7}));
}

// A deferred wait may run on the executor only while nothing enqueued can wait on what the
// session sets later: a live user event (the program's, or an import's stand-in) or a
// server-to-server gate. Events that are not user events do not count.
TEST_F(OpenCLBackendTest, EnqueuedCompleteAloneWithoutUserEventsOrGates) {
  EXPECT_TRUE(be_->EnqueuedCompleteAlone());
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({60, 0, 0}, &erep).ok());
  EXPECT_TRUE(be_->EnqueuedCompleteAlone());
  ASSERT_TRUE(be_->OnEventCreate({61, 0, ir::kEventUser}, &erep).ok());
  ASSERT_TRUE(be_->OnEventCreate({62, 0, ir::kEventUser}, &erep).ok());
  EXPECT_FALSE(be_->EnqueuedCompleteAlone());
  // A second create of a live handle is refused and counts nothing.
  EXPECT_FALSE(be_->OnEventCreate({61, 0, ir::kEventUser}, &erep).ok());
  ir::EventDestroyRep drep;
  ASSERT_TRUE(be_->OnEventDestroy({61}, &drep).ok());
  EXPECT_FALSE(be_->EnqueuedCompleteAlone());
  ASSERT_TRUE(be_->OnEventDestroy({62}, &drep).ok());
  EXPECT_FALSE(be_->OnEventDestroy({62}, &drep).ok());
  ASSERT_TRUE(be_->OnEventDestroy({60}, &drep).ok());
  EXPECT_TRUE(be_->EnqueuedCompleteAlone());
  // A gate counts until it is set (the thread that sets it counts it down just after), or
  // failed.
  auto open_again = [&] {
    for (int i = 0; i < 500 && !be_->EnqueuedCompleteAlone(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return be_->EnqueuedCompleteAlone();
  };
  Alloc(1, 64);
  auto pending = be_->WriteFromHost(0, 1, 0, 64, {}, 63);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  auto second = be_->WriteFromHost(0, 1, 0, 64, {}, 64);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(be_->EnqueuedCompleteAlone());
  std::fill_n(pending->staging->data(), 64, uint8_t{5});
  pending->release(Status::Ok());
  ir::EventWaitRep wait;
  ASSERT_TRUE(be_->OnEventWait({{63}}, &wait).ok());
  EXPECT_EQ(wait.statuses, ir::i32s{CL_COMPLETE});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(be_->EnqueuedCompleteAlone());  // the second gate is still shut
  second->release(Status(Code::kLinkLost, "the source server went away"));
  EXPECT_TRUE(open_again());
}

// The pool itself: 16 distinct slots, none when all are out, each back when its last
// reference goes (copies included), and a slot still out keeps the pool mapped.
TEST(ReadSlotsPool, TakeUntilEmptyAndGiveBack) {
  using opencl::ReadSlots;
  cl_platform_id platform;
  cl_device_id device;
  cl_int err = CL_SUCCESS;
  ASSERT_EQ(clGetPlatformIDs(1, &platform, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr), CL_SUCCESS);
  opencl::ContextRef context(clCreateContext(nullptr, 1, &device, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  auto made = ReadSlots::Make(context.get(), device);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::shared_ptr<ReadSlots> pool = made.value();
  std::vector<std::shared_ptr<uint8_t>> held;
  std::set<uint8_t*> distinct;
  for (uint32_t i = 0; i < ReadSlots::kSlots; ++i) {
    held.push_back(pool->Take());
    ASSERT_TRUE(held.back()) << "slot " << i;
    distinct.insert(held.back().get());
    std::memset(held.back().get(), static_cast<int>(i), ReadSlots::kSlotBytes);
  }
  EXPECT_EQ(distinct.size(), ReadSlots::kSlots);
  EXPECT_EQ(pool->available(), 0u);
  EXPECT_FALSE(pool->Take());
  held.pop_back();
  EXPECT_EQ(pool->available(), 1u);
  std::shared_ptr<uint8_t> copy = held.front();
  held.erase(held.begin());
  EXPECT_EQ(pool->available(), 1u) << "a copy still holds the slot";
  copy.reset();
  EXPECT_EQ(pool->available(), 2u);
  held.clear();
  EXPECT_EQ(pool->available(), ReadSlots::kSlots);
  std::shared_ptr<uint8_t> last = pool->Take();
  pool.reset();
  std::memset(last.get(), 0x5a, ReadSlots::kSlotBytes);  // still mapped
  last.reset();
}

TEST_F(OpenCLBackendTest, RmaWriteAndReadGoThroughChunks) {
  constexpr size_t kSize = 10 * MemoryBulk::kChunk + 123;
  Alloc(1, kSize + 8);
  ir::bytes host(kSize), back(kSize);
  for (size_t i = 0; i < kSize; ++i) host[i] = static_cast<uint8_t>(i * 13);
  ir::BufferWriteRep wrep;
  Status st = be_->OnBufferWrite(
      {0, 1, 8, kSize, {}, ir::Region{reinterpret_cast<uint64_t>(host.data()), kSize, 1}, {}, 0}, &wrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ir::BufferReadRep rrep;
  st = be_->OnBufferRead({0, 1, 8, kSize, ir::Region{reinterpret_cast<uint64_t>(back.data()), kSize, 1}, {}, 0}, &rrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(rrep.data.empty());
  EXPECT_EQ(back, host);
  EXPECT_EQ(bulk_.chunks, 22);
  // Inline data and a remote region at once is a contradiction.
  st = be_->OnBufferWrite({0, 1, 0, 4, {1, 2, 3, 4}, ir::Region{1, 4, 1}, {}, 0}, &wrep);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
}

// Behind a live user event, on the client's channel with deferred replies, bulk transfers
// pass through host memory: the write is pulled at once and enqueued without blocking; the
// read's bytes reach the client in its deferred reply, after the gate, and its signal (a
// marker on our landing gate) completes only then. A failed gate gives the write's bytes back
// to the budget although PoCL calls no completion callback for it.
TEST_F(OpenCLBackendTest, BulkTransfersBehindAUserEventPassThroughHostMemory) {
  auto* cl = dynamic_cast<opencl::OpenCLBackend*>(be_.get());
  ASSERT_NE(cl, nullptr);
  be_->set_bulk(&bulk_, /*client=*/true);
  be_->AllowDeferredReplies(true);
  constexpr size_t kSize = 10 * MemoryBulk::kChunk;
  Alloc(1, kSize);
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({80, 0, ir::kEventUser}, &erep).ok());
  ir::bytes host(kSize, 7), back(kSize, 0);
  ir::BufferWriteRep wrep;
  Status st = be_->OnBufferWrite(
      {0, 1, 0, kSize, {}, ir::Region{reinterpret_cast<uint64_t>(host.data()), kSize, 1}, {80}, 81}, &wrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(be_->TakeDeferredReply());
  EXPECT_EQ(cl->hosted_bytes_in_use(), kSize);
  ir::BufferReadRep rrep;
  st = be_->OnBufferRead({0, 1, 0, kSize, ir::Region{reinterpret_cast<uint64_t>(back.data()), kSize, 1}, {}, 82},
                         &rrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  DeferredWait read = be_->TakeDeferredReply();
  ASSERT_TRUE(read);
  EXPECT_EQ(cl->hosted_bytes_in_use(), 2 * kSize);
  ir::EventQueryRep q;
  ASSERT_TRUE(be_->OnEventQuery({82}, &q).ok());
  EXPECT_GT(q.status, CL_COMPLETE);
  ir::UserEventSetRep urep;
  ASSERT_TRUE(be_->OnUserEventSet({80, CL_COMPLETE}, &urep).ok());
  // The device read can end now, but the signal waits for the bytes to be at the client.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!read.done() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(read.done());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(be_->OnEventQuery({82}, &q).ok());
  EXPECT_GT(q.status, CL_COMPLETE);
  EXPECT_EQ(back[0], 0);
  st = read();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back, host);
  ir::EventWaitRep w;
  ASSERT_TRUE(be_->OnEventWait({{82}}, &w).ok());
  if (auto wait = be_->TakeDeferredReply()) {
    ASSERT_TRUE(wait().ok());
  }
  EXPECT_EQ(w.statuses, ir::i32s{CL_COMPLETE});
  read = {};
  EXPECT_EQ(cl->hosted_bytes_in_use(), 0u);

  // A write behind a user event that fails.
  ASSERT_TRUE(be_->OnEventCreate({83, 0, ir::kEventUser}, &erep).ok());
  st = be_->OnBufferWrite(
      {0, 1, 0, kSize, {}, ir::Region{reinterpret_cast<uint64_t>(host.data()), kSize, 1}, {83}, 84}, &wrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(cl->hosted_bytes_in_use(), kSize);
  ASSERT_TRUE(be_->OnUserEventSet({83, -42}, &urep).ok());
  for (int i = 0; i < 500 && cl->hosted_bytes_in_use() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(cl->hosted_bytes_in_use(), 0u);
  be_->AllowDeferredReplies(false);
}

// An inline write behind a user event keeps its bytes until the write ends, and gives them
// back when it fails through the event too (PoCL calls no completion callback then); one made
// with no user event live is not counted.
TEST_F(OpenCLBackendTest, AnInlineWriteBehindAUserEventGivesItsBytesBackWhenItFails) {
  auto* cl = dynamic_cast<opencl::OpenCLBackend*>(be_.get());
  ASSERT_NE(cl, nullptr);
  constexpr size_t kSize = 4096;
  Alloc(1, kSize);
  ir::bytes data(kSize, 9);
  ir::BufferWriteRep wrep;
  ir::UserEventSetRep urep;
  ir::EventCreateRep erep;
  for (int32_t outcome : {CL_COMPLETE, -42}) {
    const uint64_t user = outcome == CL_COMPLETE ? 90 : 92;
    ASSERT_TRUE(be_->OnEventCreate({user, 0, ir::kEventUser}, &erep).ok());
    Status st = be_->OnBufferWrite({0, 1, 0, kSize, data, {}, {user}, user + 1}, &wrep);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(cl->watched_write_bytes_in_use(), kSize) << "outcome " << outcome;
    ASSERT_TRUE(be_->OnUserEventSet({user, outcome}, &urep).ok());
    for (int i = 0; i < 500 && cl->watched_write_bytes_in_use() != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(cl->watched_write_bytes_in_use(), 0u) << "outcome " << outcome;
    ir::EventDestroyRep drep;
    ASSERT_TRUE(be_->OnEventDestroy({user}, &drep).ok());
  }
  Status st = be_->OnBufferWrite({0, 1, 0, kSize, data, {}, {}, 0}, &wrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(cl->watched_write_bytes_in_use(), 0u);
}

constexpr const char* kKernels = R"(
typedef struct { int a; float b; } pair_t;
__kernel void combine(__global int* out, int s, pair_t p, __local int* tmp) {
  size_t l = get_local_id(0);
  tmp[l] = s + p.a;
  barrier(CLK_LOCAL_MEM_FENCE);
  out[get_global_id(0)] = tmp[(l + 1) % get_local_size(0)] + (int)p.b + (int)get_global_id(0);
}
__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }
)";

TEST_F(OpenCLBackendTest, BuildFromSourceThenFromItsBinary) {
  ir::ModuleBuildRep rep = Build(10, kKernels);
  ASSERT_EQ(rep.status, CL_SUCCESS) << rep.log;
  ASSERT_EQ(rep.functions.size(), 2u);
  const ir::FunctionInfo* mix = nullptr;  // the "combine" kernel
  for (const auto& f : rep.functions)
    if (f.name == "combine") mix = &f;
  ASSERT_NE(mix, nullptr);
  ASSERT_EQ(mix->num_params, 4u);
  EXPECT_EQ(mix->params[0].kind, static_cast<uint32_t>(ir::ParamKind::kGlobal));
  EXPECT_EQ(mix->params[1].kind, static_cast<uint32_t>(ir::ParamKind::kValue));
  EXPECT_EQ(mix->params[3].kind, static_cast<uint32_t>(ir::ParamKind::kLocal));
  // A built-in value type's size, for clSetKernelArg's check; a struct's is the device's to say.
  EXPECT_EQ(mix->params[1].size, 4u);
  EXPECT_EQ(mix->params[2].size, 0u);
  EXPECT_EQ(mix->params[0].name, "out");
  // Qualifiers as the device reports them: none on these (a buffer's access is NONE).
  EXPECT_EQ(mix->params[0].access, static_cast<uint32_t>(CL_KERNEL_ARG_ACCESS_NONE));
  EXPECT_EQ(mix->params[0].type_qualifier, static_cast<uint64_t>(CL_KERNEL_ARG_TYPE_NONE));
  EXPECT_GT(mix->max_block, 0u);
  EXPECT_EQ(mix->compile_block.size(), 3u);
  ASSERT_EQ(mix->attrs.size(), 1u);
  EXPECT_EQ(mix->attrs[0].key, static_cast<uint32_t>(CL_KERNEL_ATTRIBUTES));

  ir::ModuleBinaryRep bin;
  ASSERT_TRUE(be_->OnModuleBinary({10}, &bin).ok());
  ASSERT_FALSE(bin.binary.empty());
  ir::ModuleLoadRep lrep;
  ASSERT_TRUE(be_->OnModuleLoad({11, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLBinary), bin.binary}, &lrep).ok());
  ir::ModuleBuildRep rep2;
  ASSERT_TRUE(be_->OnModuleBuild({11, ""}, &rep2).ok());
  EXPECT_EQ(rep2.status, CL_SUCCESS) << rep2.log;
  EXPECT_EQ(rep2.functions.size(), 2u);

  // A binary that is not one is refused with OpenCL's code.
  Status st = be_->OnModuleLoad({12, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLBinary), Bytes("junk")}, &lrep);
  EXPECT_EQ(st.code(), Code::kApiError);
  EXPECT_EQ(st.api(), Api::kOpenCL);
}

TEST_F(OpenCLBackendTest, FailingBuildReturnsItsLog) {
  ir::ModuleBuildRep rep = Build(20, "__kernel void broken(__global int* a) { a[0] = undefined_thing; }");
  EXPECT_EQ(rep.status, CL_BUILD_PROGRAM_FAILURE);
  EXPECT_NE(rep.log.find("undefined_thing"), std::string::npos) << rep.log;
  EXPECT_TRUE(rep.functions.empty());
}

// Separate compilation through the IR, and what a client cannot make the server do: headers
// that do not exist or do not match their names, links of nothing or of unknown modules.
TEST_F(OpenCLBackendTest, CompileWithHeadersThenLinkAndRefuseBadInputs) {
  auto load = [&](uint64_t module, const std::string& src) {
    ir::ModuleLoadRep rep;
    ASSERT_TRUE(
        be_->OnModuleLoad({module, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLSource), Bytes(src)}, &rep).ok());
  };
  load(1, "int twice(int x);\n");
  load(2, "#include \"lib.h\"\nint twice(int x) { return 2 * x; }\n");
  load(3, "#include \"lib.h\"\n__kernel void k(__global int* v) { v[get_global_id(0)] = twice(v[get_global_id(0)]); }\n");
  const ir::bytes name = Bytes(std::string("lib.h") + '\0');
  ir::ModuleCompileRep crep;
  ASSERT_TRUE(be_->OnModuleCompile({2, "", {1}, name}, &crep).ok());
  ASSERT_EQ(crep.status, CL_SUCCESS) << crep.log;
  ASSERT_TRUE(be_->OnModuleCompile({3, "", {1}, name}, &crep).ok());
  ASSERT_EQ(crep.status, CL_SUCCESS) << crep.log;
  ir::ModuleLinkRep lrep;
  ASSERT_TRUE(be_->OnModuleLink({10, 0, "", {2, 3}}, &lrep).ok());
  ASSERT_EQ(lrep.status, CL_SUCCESS) << lrep.log;
  EXPECT_EQ(lrep.created, 1u);
  EXPECT_EQ(lrep.binary_type, static_cast<uint32_t>(CL_PROGRAM_BINARY_TYPE_EXECUTABLE));
  ASSERT_EQ(lrep.functions.size(), 1u);
  EXPECT_EQ(lrep.functions[0].name, "k");
  EXPECT_EQ(lrep.functions[0].num_params, 1u);

  // A compile that fails delivers its status and log in an OK reply.
  load(4, "#include \"lib.h\"\nint broken(int x) { return undeclared + x; }\n");
  ASSERT_TRUE(be_->OnModuleCompile({4, "", {1}, name}, &crep).ok());
  EXPECT_EQ(crep.status, CL_COMPILE_PROGRAM_FAILURE);
  EXPECT_NE(crep.log.find("undeclared"), std::string::npos) << crep.log;

  EXPECT_EQ(be_->OnModuleCompile({99, "", {}, {}}, &crep).code(), Code::kUnknownHandle);
  EXPECT_EQ(be_->OnModuleCompile({2, "", {98}, name}, &crep).code(), Code::kUnknownHandle);
  EXPECT_EQ(be_->OnModuleCompile({2, "", {1}, {}}, &crep).code(), Code::kInvalidArgument);  // no name
  EXPECT_EQ(be_->OnModuleCompile({2, "", {1, 1}, name}, &crep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnModuleCompile({2, "", {1}, Bytes(std::string(1, '\0'))}, &crep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnModuleLink({11, 0, "", {}}, &lrep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnModuleLink({11, 0, "", {2, 97}}, &lrep).code(), Code::kUnknownHandle);
  EXPECT_EQ(be_->OnModuleLink({11, 99, "", {2}}, &lrep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnModuleLink({10, 0, "", {2, 3}}, &lrep).code(), Code::kInvalidArgument);  // handle in use
  // A refused link leaves no module: the handle is still free.
  ASSERT_TRUE(be_->OnModuleLink({11, 0, "", {2, 3}}, &lrep).ok());
  EXPECT_EQ(lrep.created, 1u);

  // Header names are file names for PoCL: only relative paths of plain components.
  for (const std::string& bad : std::vector<std::string>{"../escape.h", "/etc/abs.h", "a//b.h", "a/./b.h", "dir/", "a\\b.h",
                                std::string("tab\there.h")}) {
    EXPECT_EQ(be_->OnModuleCompile({2, "", {1}, Bytes(bad + '\0')}, &crep).code(), Code::kInvalidArgument) << bad;
  }
  ASSERT_TRUE(be_->OnModuleCompile({2, "", {1}, Bytes(std::string("sub/dir/lib.h") + '\0')}, &crep).ok());
  // Only modules from source compile or serve as headers (PoCL reads a header's source).
  EXPECT_EQ(be_->OnModuleCompile({10, "", {}, {}}, &crep).code(), Code::kInvalidArgument);        // a link's
  EXPECT_EQ(be_->OnModuleCompile({2, "", {10}, name}, &crep).code(), Code::kInvalidArgument);     // a link as header
}

// A marker or barrier waiting on a user event that then fails, and a barrier after them that
// fails through the queue's order: PoCL 3.1 aborts the process when such a marker's event was
// already released (found by opencl_backend_fuzz). The backend holds markers' events until they
// are done; both kinds, with and without a signal.
TEST_F(OpenCLBackendTest, MarkerOnAUserEventThatFailsDoesNotAbort) {
  ir::EventCreateRep crep;
  ASSERT_TRUE(be_->OnEventCreate({50, 0, ir::kEventUser}, &crep).ok());
  ASSERT_TRUE(be_->OnEventCreate({51, 0, 0}, &crep).ok());
  ir::MarkerRep mrep;
  ASSERT_TRUE(be_->OnMarker({0, 0, {50}, 0}, &mrep).ok());
  ASSERT_TRUE(be_->OnMarker({0, 1, {50}, 0}, &mrep).ok());
  ASSERT_TRUE(be_->OnMarker({0, 0, {50}, 51}, &mrep).ok());
  ASSERT_TRUE(be_->OnMarker({0, 1, {}, 0}, &mrep).ok());  // fails through the queue's order
  ir::EventDestroyRep drep;
  ASSERT_TRUE(be_->OnEventDestroy({51}, &drep).ok());  // the signalled one's name goes too
  ir::UserEventSetRep srep;
  ASSERT_TRUE(be_->OnUserEventSet({50, -5}, &srep).ok());
  ir::DeviceSyncRep sync;
  (void)be_->OnDeviceSync({0}, &sync);  // the markers failed: the sync may say so, but returns
  ASSERT_TRUE(be_->OnEventDestroy({50}, &drep).ok());
  // The backend still serves: a new marker after them completes.
  ASSERT_TRUE(be_->OnEventCreate({52, 0, 0}, &crep).ok());
  ASSERT_TRUE(be_->OnMarker({0, 0, {}, 52}, &mrep).ok());
  ir::EventWaitRep wrep;
  ASSERT_TRUE(be_->OnEventWait({{52}}, &wrep).ok());
  EXPECT_EQ(wrep.statuses, ir::i32s{CL_COMPLETE});
}

TEST_F(OpenCLBackendTest, LaunchWithBufferScalarStructAndLocalArgs) {
  ASSERT_EQ(Build(30, kKernels).status, CL_SUCCESS);
  ir::FunctionGetRep frep;
  ASSERT_TRUE(be_->OnFunctionGet({31, 30, "combine"}, &frep).ok());
  EXPECT_EQ(frep.info.num_params, 4u);
  Alloc(1, 64 * 4);
  struct {
    int32_t a;
    float b;
  } pair{5, 2.0f};
  ir::LaunchReq l;
  l.function = 31;
  l.dims = 1;
  l.grid = {64};
  l.block = {16};
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 1, {}},
            {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ValueBytes(int32_t{100})},
            {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ValueBytes(pair)},
            {static_cast<uint32_t>(ir::ArgKind::kLocal), 16 * 4, {}}};
  ir::LaunchRep lrep;
  Status st = be_->OnLaunch(l, &lrep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ir::bytes out = Read(1, 0, 64 * 4);
  for (int i = 0; i < 64; ++i) {
    int32_t v;
    std::memcpy(&v, out.data() + 4 * i, 4);
    EXPECT_EQ(v, 100 + 5 + 2 + i);
  }
  // Arguments left as the last launch set them are not set again: changed ones must still
  // take effect, in either direction.
  Alloc(3, 64 * 4);
  for (auto [buffer, scalar] : {std::pair<uint64_t, int32_t>{3, 200}, {1, 300}, {1, 300}}) {
    l.args[0].value = buffer;
    l.args[1].data = ValueBytes(scalar);
    ASSERT_TRUE(be_->OnLaunch(l, &lrep).ok());
    ir::bytes got = Read(buffer, 0, 64 * 4);
    for (int i = 0; i < 64; i += 21) {
      int32_t v;
      std::memcpy(&v, got.data() + 4 * i, 4);
      EXPECT_EQ(v, scalar + 5 + 2 + i) << "buffer " << buffer << ", element " << i;
    }
  }
  // With a global offset, and with the local size left to the runtime.
  l.function = 32;
  ASSERT_TRUE(be_->OnFunctionGet({32, 30, "twice"}, &frep).ok());
  Alloc(2, 8 * 4);
  std::vector<float> ones(8, 1.0f);
  const auto* one_bytes = reinterpret_cast<const uint8_t*>(ones.data());
  ASSERT_TRUE(Write(2, 0, ir::bytes(one_bytes, one_bytes + 32)).ok());
  l.grid = {4};
  l.block = {};
  l.offset = {4};
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 2, {}}};
  ASSERT_TRUE(be_->OnLaunch(l, &lrep).ok());
  ir::bytes floats = Read(2, 0, 32);
  std::vector<float> got(8);
  std::memcpy(got.data(), floats.data(), 32);
  EXPECT_EQ(got, (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
}

TEST_F(OpenCLBackendTest, LocalMemoryBeyondTheDeviceAndAWrappingOffsetAreRefusedBeforeTheEnqueue) {
  // PoCL aborted the worker on a launch whose local arguments exceed the device's local
  // memory (at the next clFinish); NVIDIA's OpenCL refuses the enqueue. Refused here, the
  // session goes on and the next launch runs.
  ASSERT_EQ(Build(35, kKernels).status, CL_SUCCESS);
  ir::FunctionGetRep frep;
  ASSERT_TRUE(be_->OnFunctionGet({36, 35, "combine"}, &frep).ok());
  Alloc(1, 64 * 4);
  ir::LaunchReq l;
  l.function = 36;
  l.dims = 1;
  l.grid = {64};
  l.block = {16};
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 1, {}},
            {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ValueBytes(int32_t{1})},
            {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ValueBytes(uint64_t{0})},
            {static_cast<uint32_t>(ir::ArgKind::kLocal), uint64_t{1} << 40, {}}};
  ir::LaunchRep lrep;
  Status st = be_->OnLaunch(l, &lrep);
  EXPECT_EQ(st.api(), Api::kOpenCL);
  EXPECT_EQ(st.native(), CL_OUT_OF_RESOURCES) << st.ToString();
  EXPECT_NE(st.message().find("local memory"), std::string::npos) << st.ToString();
  // A size whose sum with the kernel's own would wrap.
  l.args[3].value = UINT64_MAX;
  EXPECT_EQ(be_->OnLaunch(l, &lrep).native(), CL_OUT_OF_RESOURCES);
  // global offset + size past 2^64
  l.args[3].value = 16 * 4;
  l.offset = {UINT64_MAX - 10};
  st = be_->OnLaunch(l, &lrep);
  EXPECT_EQ(st.native(), CL_INVALID_GLOBAL_OFFSET) << st.ToString();
  // The session goes on: the same launch, within bounds, runs.
  l.offset = {};
  ASSERT_TRUE(be_->OnLaunch(l, &lrep).ok());
  ir::bytes out = Read(1, 0, 64 * 4);
  int32_t v;
  std::memcpy(&v, out.data() + 4 * 63, 4);
  EXPECT_EQ(v, 1 + 0 + 0 + 63);
}

TEST_F(OpenCLBackendTest, EventsUserEventsAndProfiling) {
  ir::StreamCreateRep srep;
  ASSERT_TRUE(be_->OnStreamCreate({40, 0, ir::kStreamProfiling, 0}, &srep).ok());
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({41, 0, ir::kEventUser}, &erep).ok());
  Alloc(1, 16);
  // A write that waits on the user event stays queued until the client sets it.
  ir::BufferWriteRep wrep;
  ASSERT_TRUE(be_->OnBufferWrite({40, 1, 0, 4, {1, 2, 3, 4}, {}, {41}, 42}, &wrep).ok());
  ir::EventQueryRep q;
  ASSERT_TRUE(be_->OnEventQuery({42}, &q).ok());
  EXPECT_GT(q.status, CL_COMPLETE);
  ir::UserEventSetRep urep;
  ASSERT_TRUE(be_->OnUserEventSet({41, CL_COMPLETE}, &urep).ok());
  ir::EventWaitRep wait;
  ASSERT_TRUE(be_->OnEventWait({{42, 41}}, &wait).ok());
  EXPECT_EQ(wait.statuses, (ir::i32s{CL_COMPLETE, CL_COMPLETE}));
  ir::EventTimesRep t;
  Status st = be_->OnEventTimes({42}, &t);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_LE(t.queued, t.submit);
  EXPECT_LE(t.submit, t.start);
  EXPECT_LE(t.start, t.end);
  // Marker and barrier signal events too; a user event cannot be bound as a signal.
  ir::MarkerRep mrep;
  ASSERT_TRUE(be_->OnMarker({40, 0, {42}, 43}, &mrep).ok());
  ASSERT_TRUE(be_->OnMarker({40, 1, {}, 44}, &mrep).ok());
  EXPECT_EQ(be_->OnMarker({40, 0, {}, 41}, &mrep).code(), Code::kInvalidArgument);
  ir::StreamSyncRep sync;
  ASSERT_TRUE(be_->OnStreamSync({40}, &sync).ok());
  ASSERT_TRUE(be_->OnEventQuery({44}, &q).ok());
  EXPECT_EQ(q.status, CL_COMPLETE);
  ir::DeviceSyncRep dsync;
  EXPECT_TRUE(be_->OnDeviceSync({0}, &dsync).ok());
  ir::EventDestroyRep drep;
  EXPECT_TRUE(be_->OnEventDestroy({42}, &drep).ok());
  EXPECT_EQ(be_->OnEventQuery({42}, &q).code(), Code::kUnknownHandle);
  ir::StreamDestroyRep sdrep;
  EXPECT_TRUE(be_->OnStreamDestroy({40}, &sdrep).ok());
}

// A stream destroyed while its clFinish waits off the executor (the waiter thread): the wait
// shares the queue (SharedQueue), so it goes on waiting for the queue's commands and ends when
// they do; the stream's handle is free at once for a new queue; and the queue goes with the
// wait. The command behind the wait waits on a user event set only after the destroy.
TEST_F(OpenCLBackendTest, StreamDestroyedWhileItsFinishWaitsOffTheExecutor) {
  Alloc(1, 4096);
  Alloc(2, 4096);
  ir::bytes data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 5 + 1);
  ASSERT_TRUE(Write(1, 0, data).ok());
  ir::StreamCreateRep sc;
  ASSERT_TRUE(be_->OnStreamCreate({60, 0, 0, 0}, &sc).ok());
  ir::EventCreateRep ec;
  ASSERT_TRUE(be_->OnEventCreate({90, 0, ir::kEventUser}, &ec).ok());
  ir::BufferCopyRep cr;
  ASSERT_TRUE(be_->OnBufferCopy({60, 1, 0, 2, 0, 4096, {90}, 91}, &cr).ok());
  auto wait = DeferredStreamSync(60);
  ASSERT_TRUE(wait);
  std::promise<Status> result;
  std::future<Status> done = result.get_future();
  std::thread waiter([w = std::move(wait), &result]() mutable {
    result.set_value(w());
    w = {};  // the destroyed stream's last reference goes here
  });
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout) << "the wait did not block";
  ir::StreamDestroyRep sd;
  ASSERT_TRUE(be_->OnStreamDestroy({60}, &sd).ok());
  ASSERT_TRUE(be_->OnStreamCreate({60, 0, 0, 0}, &sc).ok());  // the handle again: a new queue
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ir::UserEventSetRep us;
  ASSERT_TRUE(be_->OnUserEventSet({90, CL_COMPLETE}, &us).ok());
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  Status st = done.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  waiter.join();
  ir::EventQueryRep q;
  ASSERT_TRUE(be_->OnEventQuery({91}, &q).ok());
  EXPECT_EQ(q.status, CL_COMPLETE);
  be_->AllowDeferredReplies(false);
  EXPECT_EQ(Read(2, 0, 4096), data);
  ir::BufferWriteRep wrep;  // the new stream 60 works
  ASSERT_TRUE(be_->OnBufferWrite({60, 2, 0, 4, {9, 8, 7, 6}, {}, {}, 0}, &wrep).ok());
  ir::StreamSyncRep ss;
  ASSERT_TRUE(be_->OnStreamSync({60}, &ss).ok());
  EXPECT_EQ(Read(2, 0, 4), (ir::bytes{9, 8, 7, 6}));
}

// The backend itself goes while a deferred clFinish still runs on another thread (a worker
// winding up): the wait holds its queue, and with it the queue's context, until it ends.
TEST_F(OpenCLBackendTest, BackendDestroyedWhileAFinishWaitsOffTheExecutor) {
  ir::StreamCreateRep sc;
  ASSERT_TRUE(be_->OnStreamCreate({60, 0, 0, 0}, &sc).ok());
  ir::LaunchReq spin;
  ASSERT_NO_FATAL_FAILURE(SpinLaunch(4, &spin));
  spin.stream = 60;
  ir::LaunchRep lrep;
  ASSERT_TRUE(be_->OnLaunch(spin, &lrep).ok());
  auto wait = DeferredStreamSync(60);
  ASSERT_TRUE(wait);
  Status st = Status(Code::kInternal, "the wait did not run");
  std::thread waiter([w = std::move(wait), &st]() mutable {
    st = w();
    w = {};
  });
  ir::StreamDestroyRep sd;
  ASSERT_TRUE(be_->OnStreamDestroy({60}, &sd).ok());
  be_.reset();
  waiter.join();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A finish that does not run in place waits for a marker; when a user event before it fails,
// PoCL fails the marker at once, while a long kernel before that still runs. The finish must
// still wait for the kernel, as clFinish does.
TEST_F(OpenCLBackendTest, AFinishWhoseMarkerFailsEarlyStillWaitsForWhatRuns) {
  Alloc(1, 64);
  ir::StreamCreateRep sc;
  ASSERT_TRUE(be_->OnStreamCreate({60, 0, 0, 0}, &sc).ok());
  ir::LaunchReq spin;
  ASSERT_NO_FATAL_FAILURE(SpinLaunch(4, &spin));
  spin.stream = 60;
  spin.signal = 95;
  ir::LaunchRep lrep;
  ASSERT_TRUE(be_->OnLaunch(spin, &lrep).ok());
  ir::EventCreateRep ec;
  ASSERT_TRUE(be_->OnEventCreate({90, 0, ir::kEventUser}, &ec).ok());
  ir::BufferFillRep fr;
  ASSERT_TRUE(be_->OnBufferFill({60, 1, 0, 64, {1, 2, 3, 4}, {90}, 91}, &fr).ok());
  auto wait = DeferredStreamSync(60);
  ASSERT_TRUE(wait);
  EXPECT_FALSE(wait.done()) << "the kernel ended before the test could fail the event";
  ir::UserEventSetRep us;
  ASSERT_TRUE(be_->OnUserEventSet({90, -5}, &us).ok());
  // Not done while its wait may still block (in the fallback's clFinish): a later reply must
  // not wait for it (LateReplies).
  EXPECT_FALSE(wait.done()) << "a failed marker counted as done";
  const Status st = wait();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(wait.done());
  ir::EventQueryRep q;
  ASSERT_TRUE(be_->OnEventQuery({95}, &q).ok());
  EXPECT_EQ(q.status, CL_COMPLETE) << "the finish returned while the kernel before it still ran";
  be_->AllowDeferredReplies(false);
  ir::StreamDestroyRep sd;
  EXPECT_TRUE(be_->OnStreamDestroy({60}, &sd).ok());
}

// EventTimes of a command still running waits for it rather than answering
// CL_PROFILING_INFO_NOT_AVAILABLE (NVIDIA's answer, now and then, for an event whose
// completion the driver has not noted yet although its bytes had landed).
TEST_F(OpenCLBackendTest, EventTimesOfACommandNotNotedDoneWaitsForIt) {
  ir::StreamCreateRep srep;
  ASSERT_TRUE(be_->OnStreamCreate({60, 0, ir::kStreamProfiling, 0}, &srep).ok());
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({61, 0, 0}, &erep).ok());
  ASSERT_EQ(Build(62, "__kernel void spin(__global int* x, int n) {"
                      "  int v = x[0]; for (int i = 0; i < n; ++i) v = v * 1103515245 + 12345; x[0] = v; }")
                .status,
            CL_SUCCESS);
  ir::FunctionGetRep frep;
  ASSERT_TRUE(be_->OnFunctionGet({63, 62, "spin"}, &frep).ok());
  Alloc(64, 4);
  ir::LaunchReq l;
  l.stream = 60;
  l.function = 63;
  l.dims = 1;
  l.grid = {1};
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 64, {}},
            {static_cast<uint32_t>(ir::ArgKind::kBytes), 0, ValueBytes(int32_t{200000000})}};
  l.signal = 61;
  ir::LaunchRep lrep;
  ASSERT_TRUE(be_->OnLaunch(l, &lrep).ok());
  ir::StreamFlushRep frep2;
  ASSERT_TRUE(be_->OnStreamFlush({60}, &frep2).ok());
  ir::EventTimesRep t;
  Status st = be_->OnEventTimes({61}, &t);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_LE(t.start, t.end);
  EXPECT_GT(t.end, 0u);
  ir::EventQueryRep q;
  ASSERT_TRUE(be_->OnEventQuery({61}, &q).ok());
  EXPECT_EQ(q.status, CL_COMPLETE);
}

TEST_F(OpenCLBackendTest, ValidationErrors) {
  Alloc(1, 100);
  ir::BufferAllocRep arep;
  EXPECT_EQ(be_->OnBufferAlloc({1, 0, 8, 0, 0}, &arep).code(), Code::kInvalidArgument);   // live handle
  EXPECT_EQ(be_->OnBufferAlloc({0, 0, 8, 0, 0}, &arep).code(), Code::kInvalidArgument);   // handle 0
  EXPECT_EQ(be_->OnBufferAlloc({2, 0, 0, 0, 0}, &arep).code(), Code::kInvalidArgument);   // size 0
  EXPECT_EQ(be_->OnBufferAlloc({2, 7, 8, 0, 0}, &arep).code(), Code::kInvalidArgument);   // device
  EXPECT_EQ(be_->OnBufferAlloc({2, 0, 8, 64, 0}, &arep).code(), Code::kInvalidArgument);  // flags

  // Out of range, including offsets that would overflow a naive offset + size.
  EXPECT_EQ(Write(1, 90, ir::bytes(11)).code(), Code::kInvalidArgument);
  EXPECT_EQ(Write(1, ~0ull - 2, ir::bytes(4)).code(), Code::kInvalidArgument);
  ir::BufferReadRep rrep;
  EXPECT_EQ(be_->OnBufferRead({0, 1, 0, 101, {}, {}, 0}, &rrep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferRead({0, 9, 0, 1, {}, {}, 0}, &rrep).code(), Code::kUnknownHandle);
  ir::BufferCopyRep crep;
  EXPECT_EQ(be_->OnBufferCopy({0, 1, 50, 1, 0, 51, {}, 0}, &crep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferCopy({0, 1, 0, 9, 0, 1, {}, 0}, &crep).code(), Code::kUnknownHandle);
  ir::BufferWriteRep wrep;
  EXPECT_EQ(be_->OnBufferWrite({0, 1, 0, 8, {1, 2, 3}, {}, {}, 0}, &wrep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferWrite({77, 1, 0, 3, {1, 2, 3}, {}, {}, 0}, &wrep).code(), Code::kUnknownHandle);
  EXPECT_EQ(be_->OnBufferWrite({0, 1, 0, 3, {1, 2, 3}, {}, {55}, 0}, &wrep).code(), Code::kUnknownHandle);

  // Fill patterns: a power of two up to 128 bytes, dividing offset and size.
  ir::BufferFillRep frep;
  EXPECT_EQ(be_->OnBufferFill({0, 1, 0, 12, {1, 2, 3}, {}, 0}, &frep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferFill({0, 1, 0, 12, {}, {}, 0}, &frep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferFill({0, 1, 0, 10, {1, 2, 3, 4}, {}, 0}, &frep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferFill({0, 1, 2, 8, {1, 2, 3, 4}, {}, 0}, &frep).code(), Code::kInvalidArgument);

  // Rectangles: three values per vector, four pitches, inside both buffers.
  ir::BufferCopyRectRep rect;
  EXPECT_EQ(be_->OnBufferCopyRect({0, 1, 1, {0, 0}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0, 0}, {}, 0}, &rect).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferCopyRect({0, 1, 1, {0, 0, 0}, {0, 0, 0}, {10, 11, 1}, {10, 0, 10, 0}, {}, 0}, &rect).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(be_->OnBufferCopyRect({0, 1, 1, {0, ~0ull, 0}, {0, 0, 0}, {1, 2, 1}, {0, 0, 0, 0}, {}, 0}, &rect).code(),
            Code::kInvalidArgument);

  // Modules and launches.
  ir::ModuleLoadRep lrep;
  EXPECT_EQ(be_->OnModuleLoad({5, 0, 99, Bytes("x")}, &lrep).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->OnModuleLoad({5, 0, 1, {}}, &lrep).code(), Code::kInvalidArgument);
  ASSERT_EQ(Build(5, kKernels).status, CL_SUCCESS);
  ir::FunctionGetRep frep2;
  Status st = be_->OnFunctionGet({6, 5, "nope"}, &frep2);
  EXPECT_EQ(st.code(), Code::kApiError);
  EXPECT_EQ(st.native(), CL_INVALID_KERNEL_NAME);
  ASSERT_TRUE(be_->OnFunctionGet({6, 5, "twice"}, &frep2).ok());
  EXPECT_EQ(be_->OnFunctionGet({6, 5, "twice"}, &frep2).code(), Code::kInvalidArgument);
  ir::LaunchReq l;
  l.function = 6;
  l.dims = 4;
  l.grid = {1, 1, 1, 1};
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 1, {}}};
  ir::LaunchRep launch;
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // 4 dims
  l.dims = 2;
  l.grid = {4};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // grid size != dims
  l.dims = 1;
  l.block = {1, 1};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // block size != dims
  l.block = {};
  l.grid = {0};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // empty grid
  l.grid = {4};
  l.args = {};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // argument count
  l.args = {{static_cast<uint32_t>(ir::ArgKind::kBuffer), 99, {}}};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kUnknownHandle);
  l.args = {{9, 1, {}}};
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kInvalidArgument);  // arg kind
  l.function = 60;
  EXPECT_EQ(be_->OnLaunch(l, &launch).code(), Code::kUnknownHandle);

  // Streams, events.
  ir::StreamCreateRep srep;
  EXPECT_EQ(be_->OnStreamCreate({8, 0, 64, 0}, &srep).code(), Code::kInvalidArgument);
  ir::StreamSyncRep sync;
  EXPECT_EQ(be_->OnStreamSync({123}, &sync).code(), Code::kUnknownHandle);
  ir::UserEventSetRep urep;
  ir::EventCreateRep erep;
  ASSERT_TRUE(be_->OnEventCreate({9, 0, 0}, &erep).ok());
  EXPECT_EQ(be_->OnUserEventSet({9, 0}, &urep).code(), Code::kInvalidArgument);  // not a user event
  ir::EventTimesRep times;
  EXPECT_EQ(be_->OnEventTimes({9}, &times).code(), Code::kApiError);  // never signalled
}

}  // namespace
}  // namespace tandem::server
