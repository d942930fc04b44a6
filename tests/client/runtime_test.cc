// Tier 3: the client runtime against a real tandemd: device discovery, batching, deferred
// errors (also across a replica's loss under redundancy), inline and RMA transfers, and clear
// errors (never hangs) when a server is unreachable or dies under a waiting call.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>

#include "../server/daemon.h"
#include "stats.h"
#include "tandem/client/runtime.h"

namespace tandem::client {
namespace {

using namespace std::chrono_literals;

// Ends the test process with a message when the scope is not left in time: for a test whose
// failure is a wait that never ends.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, const char* what)
      : thread_([this, limit, what] {
          std::unique_lock<std::mutex> l(m_);
          if (cv_.wait_for(l, limit, [&] { return done_; })) return;
          std::fprintf(stderr, "watchdog: nothing after %lld s: %s\n", static_cast<long long>(limit.count()), what);
          std::_Exit(1);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the rest is made
};

// OpenCL device property key for the device name (CL_DEVICE_NAME).
constexpr uint32_t kClDeviceName = 0x102B;

class Live : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new test::Daemon({});
    ASSERT_FALSE(daemon_->address().empty());
    setenv("TANDEM_SERVERS", daemon_->address().c_str(), 1);
    // How long the start-up took (Hello, the worker opening its backend, Attach): the
    // connect timeout above has to cover it on a loaded GPU host.
    const auto start = std::chrono::steady_clock::now();
    const Status st = Runtime::Get().status();
    std::printf("[ start-up ] connected in %.0f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << daemon_->Log();
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  static Device& Dev() { return *Runtime::Get().Devices(Api::kOpenCL).at(0); }
  static test::Daemon* daemon_;
};
test::Daemon* Live::daemon_ = nullptr;

TEST_F(Live, DiscoversDevicesWithProperties) {
  // Every OpenCL device of the server's platforms (PoCL here; NVIDIA and PoCL on a GPU host).
  auto devs = Runtime::Get().Devices(Api::kOpenCL);
  ASSERT_GE(devs.size(), 1u);
  for (size_t i = 0; i < devs.size(); ++i) EXPECT_EQ(devs[i]->index, i);
  EXPECT_FALSE(devs[0]->info.name.empty());
  const ir::bytes* name = devs[0]->Prop(kClDeviceName);
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(name->data())).substr(0, devs[0]->info.name.size()),
            devs[0]->info.name);
  EXPECT_TRUE(Runtime::Get().Devices(Api::kCuda).empty());
}

TEST_F(Live, BatchesAsynchronousCommandsUntilASyncPoint) {
  Session& s = *Dev().session;
  auto& rt = Runtime::Get();
  // Creation and destruction need no round trip: a thousand go out as a few batches.
  for (int i = 0; i < 500; ++i) {
    uint64_t b = rt.NewHandle();
    s.Post(ir::BufferAllocReq{.buffer = b, .device = Dev().remote_index, .size = 4096});
    s.Post(ir::BufferFreeReq{.buffer = b});
  }
  auto pong = s.Call(ir::PingReq{.nonce = 42});
  ASSERT_TRUE(pong.ok()) << pong.status().ToString();
  EXPECT_EQ(pong->nonce, 42u);
  ASSERT_TRUE(s.Call(ir::DeviceSyncReq{.device = Dev().remote_index}).ok());
  EXPECT_TRUE(s.TakeAsyncErrors().empty());
}

TEST_F(Live, ReportsFailedAsyncCommandsAtTheNextSync) {
  Session& s = *Dev().session;
  s.Post(ir::BufferFreeReq{.buffer = 0xDEADBEEF});  // never allocated
  // A sync point of the command stream (a Ping is urgent: it overtakes the stream).
  ASSERT_TRUE(s.Call(ir::DeviceSyncReq{.device = Dev().remote_index}).ok());
  auto errors = s.TakeAsyncErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].opcode, static_cast<uint32_t>(ir::Opcode::kBufferFree));
  EXPECT_EQ(errors[0].code, static_cast<uint32_t>(Code::kUnknownHandle));
  EXPECT_TRUE(s.TakeAsyncErrors().empty());
}

TEST_F(Live, MovesDataInlineAndByRma) {
  Session& s = *Dev().session;
  for (size_t size : {size_t{100}, size_t{8} << 20}) {  // inline, then RMA
    uint64_t b = Runtime::Get().NewHandle();
    s.Post(ir::BufferAllocReq{.buffer = b, .device = Dev().remote_index, .size = size});
    std::vector<uint8_t> out(size), in(size, 0);
    std::iota(out.begin(), out.end(), static_cast<uint8_t>(size));
    ASSERT_TRUE(WriteBuffer(s, {.buffer = b, .offset = 0, .size = size}, out.data(), true).ok());
    ASSERT_TRUE(ReadBuffer(s, {.buffer = b, .offset = 0, .size = size}, in.data(), true).ok());
    EXPECT_EQ(in, out) << size;
    // Out of range: a clear error, not a crash.
    Status st = ReadBuffer(s, {.buffer = b, .offset = size - 1, .size = 2}, in.data(), true);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    s.Post(ir::BufferFreeReq{.buffer = b});
  }
}

TEST_F(Live, NonBlockingReadCompletesThroughItsCallback) {
  Session& s = *Dev().session;
  uint64_t b = Runtime::Get().NewHandle();
  s.Post(ir::BufferAllocReq{.buffer = b, .device = Dev().remote_index, .size = 64});
  std::vector<uint8_t> out(64, 7), in(64, 0);
  ASSERT_TRUE(WriteBuffer(s, {.buffer = b, .size = 64}, out.data(), false).ok());
  std::atomic<bool> done{false};
  ASSERT_TRUE(ReadBuffer(s, {.buffer = b, .size = 64}, in.data(), false, [&](const Status& st) {
                EXPECT_TRUE(st.ok());
                done = true;
              }).ok());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(done);
  EXPECT_EQ(in, out);
}

// A read that waits for a user event blocks the session's queue on the server; setting the
// event must still get through (urgent commands bypass the queue), as it does natively.
TEST_F(Live, UserEventReleasesABlockedRead) {
  Session& s = *Dev().session;
  auto& rt = Runtime::Get();
  uint64_t b = rt.NewHandle(), user = rt.NewHandle(), written = rt.NewHandle();
  s.Post(ir::BufferAllocReq{.buffer = b, .device = Dev().remote_index, .size = 16});
  s.Post(ir::EventCreateReq{.event = user, .device = Dev().remote_index, .flags = ir::kEventUser});
  std::vector<uint8_t> out(16, 9), in(16, 0);
  ASSERT_TRUE(WriteBuffer(s, {.buffer = b, .size = 16, .wait = {user}, .signal = written}, out.data(), false).ok());
  std::atomic<bool> done{false};
  ASSERT_TRUE(ReadBuffer(s, {.buffer = b, .size = 16, .wait = {written}}, in.data(), false,
                         [&](const Status& st) {
                           EXPECT_TRUE(st.ok()) << st.ToString();
                           done = true;
                         }).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(done) << "the read did not wait for the user event";
  s.Post(ir::UserEventSetReq{.event = user, .status = 0});
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(done) << "the blocked read was never released";
  EXPECT_EQ(in, out);
  EXPECT_TRUE(s.Call(ir::PingReq{.nonce = 4}).ok());
}

// Last in the suite: the server dies while a call waits; the call fails, it does not hang.
TEST_F(Live, ZServerDeathFailsTheWaitingCall) {
  Session& s = *Dev().session;
  ASSERT_TRUE(s.Call(ir::PingReq{.nonce = 2}).ok());
  delete daemon_;  // SIGKILL: its session worker dies with it, without a goodbye
  daemon_ = nullptr;
  auto start = std::chrono::steady_clock::now();
  auto r = s.Call(ir::DeviceSyncReq{.device = 0});
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsTransport()) << r.status().ToString();
  EXPECT_LT(waited, 20s);
  EXPECT_FALSE(s.health().ok());
  // Later work fails at once with the same reason.
  EXPECT_FALSE(s.Call(ir::PingReq{.nonce = 3}).ok());
}

TEST(Parse, ServerSpecs) {
  ServerSpec s;
  ASSERT_TRUE(ParseServerSpec("127.0.0.1:7000", &s));
  EXPECT_EQ(s.address, "127.0.0.1:7000");
  EXPECT_FALSE(s.device.has_value());
  ASSERT_TRUE(ParseServerSpec("gpu1:7000/3", &s));
  EXPECT_EQ(s.address, "gpu1:7000");
  EXPECT_EQ(s.device, 3u);
  ASSERT_TRUE(ParseServerSpec("[::1]:7000/0", &s));
  EXPECT_EQ(s.address, "[::1]:7000");
  for (const char* bad : {"gpu1", "gpu1:7000/", "gpu1:7000/x", "gpu1:7000/-1", ":7000/1/2"})
    EXPECT_FALSE(ParseServerSpec(bad, &s)) << bad;
  EXPECT_EQ(ParseServerList(" a:1, b:2/0 ,,c:3"), (std::vector<std::string>{"a:1", "b:2/0", "c:3"}));
}

// CUDA_VISIBLE_DEVICES as CUDA reads it: order kept, the list ends at the first bad entry.
TEST(Parse, VisibleDevices) {
  using V = std::vector<size_t>;
  EXPECT_EQ(VisibleDevices(nullptr, 3), (V{0, 1, 2}));
  EXPECT_EQ(VisibleDevices("", 3), V{});
  EXPECT_EQ(VisibleDevices("2,0", 3), (V{2, 0}));
  EXPECT_EQ(VisibleDevices("1,7,0", 3), V{1});
  EXPECT_EQ(VisibleDevices("1,1,0", 3), V{1});
  EXPECT_EQ(VisibleDevices(" 0 , 2", 3), (V{0, 2}));
  EXPECT_EQ(VisibleDevices("GPU-1234", 3), V{});
  EXPECT_EQ(VisibleDevices("-1", 3), V{});
}

// Two servers form one device list, in the order TANDEM_SERVERS gives, one session each.
TEST(TwoServers, FormOneOrderedDeviceList) {
  test::Daemon a({}), b({});
  ASSERT_FALSE(a.address().empty());
  ASSERT_FALSE(b.address().empty());
  const std::string list = b.address() + "/0," + a.address() + "," + b.address();
  setenv("TANDEM_SERVERS", list.c_str(), 1);
  auto& rt = Runtime::Get();
  ASSERT_TRUE(rt.status().ok()) << rt.status().ToString();
  auto devs = rt.Devices(Api::kOpenCL);
  ASSERT_GE(devs.size(), 2u);
  EXPECT_EQ(devs[0]->session->server(), b.address());
  EXPECT_EQ(devs[0]->remote_index, 0u);
  EXPECT_EQ(devs[1]->session->server(), a.address());
  EXPECT_NE(devs[0]->session, devs[1]->session);
  for (size_t i = 0; i < devs.size(); ++i) {
    EXPECT_EQ(devs[i]->index, i);
    for (size_t j = 0; j < i; ++j)  // no device twice, though b is named twice
      EXPECT_FALSE(devs[i]->session == devs[j]->session && devs[i]->remote_index == devs[j]->remote_index);
  }
  // Both sessions carry data.
  for (Device* d : {devs[0], devs[1]}) {
    Session& s = *d->session;
    uint64_t buf = rt.NewHandle();
    s.Post(ir::BufferAllocReq{.buffer = buf, .device = d->remote_index, .size = 256});
    std::vector<uint8_t> out(256), in(256);
    std::iota(out.begin(), out.end(), static_cast<uint8_t>(d->index));
    ASSERT_TRUE(WriteBuffer(s, {.buffer = buf, .size = 256}, out.data(), true).ok());
    ASSERT_TRUE(ReadBuffer(s, {.buffer = buf, .size = 256}, in.data(), true).ok());
    EXPECT_EQ(in, out) << s.server();
  }
  rt.Shutdown();  // before the daemons go
}

// Under redundancy a deferred error belongs to the group, not to a replica's session: one the
// program has not taken yet survives the loss of the replica that reported it (the primary,
// whose place a spare takes), one it took is not reported again when a slower replica reports
// it too, and one still in flight when the primary dies comes from the survivor.
TEST(Redundancy, DeferredErrorsSurviveTheLossOfTheirReplica) {
  test::Daemon a({}), b({}), c({}), d({});
  for (auto* daemon : {&a, &b, &c, &d}) ASSERT_FALSE(daemon->address().empty());
  setenv("TANDEM_SERVERS", (a.address() + "," + b.address()).c_str(), 1);
  setenv("TANDEM_REDUNDANCY", "2", 1);
  setenv("TANDEM_SPARE_SERVERS", (c.address() + "," + d.address()).c_str(), 1);
  auto& rt = Runtime::Get();
  ASSERT_TRUE(rt.status().ok()) << rt.status().ToString();
  Device& dev = *rt.Devices(Api::kOpenCL).at(0);
  Session& s = *dev.session;
  auto free_unknown = [&](uint64_t handle) { s.Post(ir::BufferFreeReq{.buffer = handle}); };
  auto sync = [&] { return s.Call(ir::DeviceSyncReq{.device = dev.remote_index}).status(); };
  auto expect_one_error = [&](const char* when) {
    auto errors = s.TakeAsyncErrors();
    ASSERT_EQ(errors.size(), 1u) << when;
    EXPECT_EQ(errors[0].opcode, static_cast<uint32_t>(ir::Opcode::kBufferFree)) << when;
    EXPECT_EQ(errors[0].code, static_cast<uint32_t>(Code::kUnknownHandle)) << when;
  };

  free_unknown(0xDEAD0001);
  ASSERT_TRUE(sync().ok());
  expect_one_error("taken before any loss");

  free_unknown(0xDEAD0002);
  ASSERT_TRUE(sync().ok());  // the primary (a) has reported it; the program has not taken it
  a.Kill();
  Status st = sync();  // answered once a spare has taken a's place
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Stats::Get().migrations.load(), 1u);
  expect_one_error("reported by the lost primary, not taken");

  free_unknown(0xDEAD0003);
  ASSERT_TRUE(s.Flush().ok());
  b.Kill();  // the primary now, perhaps before it ran the free
  st = sync();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Stats::Get().migrations.load(), 2u);
  expect_one_error("in flight when the primary died");
  EXPECT_TRUE(s.TakeAsyncErrors().empty());
  rt.Shutdown();  // before the daemons go
}

// A rollback replays the log from the checkpoint on restored sessions: a failed command in it
// fails again there, and its error, which the program had not taken when the replicas
// disagreed, is reported once (the replay's copy is not new). Replica b flips a bit of every
// read back, so the first read back (which takes the first checkpoint) rolls back until a
// spare joins as the third voter and outvotes b.
TEST(Rollback, AFailedCommandTheReplayRunsAgainIsReportedOnce) {
  test::Daemon a({}), b({"--inject-bitflip", "1"}), c({});
  for (auto* daemon : {&a, &b, &c}) ASSERT_FALSE(daemon->address().empty());
  setenv("TANDEM_SERVERS", (a.address() + "," + b.address()).c_str(), 1);
  setenv("TANDEM_REDUNDANCY", "2", 1);
  setenv("TANDEM_SPARE_SERVERS", c.address().c_str(), 1);
  setenv("TANDEM_MAX_RETRIES", "1", 1);
  auto& rt = Runtime::Get();
  ASSERT_TRUE(rt.status().ok()) << rt.status().ToString();
  Device& dev = *rt.Devices(Api::kOpenCL).at(0);
  Session& s = *dev.session;
  const uint64_t buf = rt.NewHandle();
  s.Post(ir::BufferAllocReq{.buffer = buf, .device = dev.remote_index, .size = 4096});
  std::vector<uint8_t> out(4096), in(4096, 0);
  std::iota(out.begin(), out.end(), uint8_t{7});
  ASSERT_TRUE(WriteBuffer(s, {.buffer = buf, .size = out.size()}, out.data(), true).ok());
  s.Post(ir::BufferFreeReq{.buffer = 0xDEAD0001});  // never allocated
  // A failed command the program asked an answer of has its error in that answer; the
  // replay asks again, so it is not deferred as one more error.
  EXPECT_EQ(s.Call(ir::BufferFreeReq{.buffer = 0xDEAD0003}).status().code(), Code::kUnknownHandle);
  Status st = ReadBuffer(s, {.buffer = buf, .size = in.size()}, in.data(), true);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(in, out);
  EXPECT_GE(Stats::Get().rollbacks.load(), 1u);
  auto errors = s.TakeAsyncErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].opcode, static_cast<uint32_t>(ir::Opcode::kBufferFree));
  EXPECT_EQ(errors[0].code, static_cast<uint32_t>(Code::kUnknownHandle));
  // Three voters now: b is outvoted at each read back and restored from a winner, server to
  // server. A new failure is reported once, the old one not again.
  s.Post(ir::BufferFreeReq{.buffer = 0xDEAD0002});
  st = ReadBuffer(s, {.buffer = buf, .size = in.size()}, in.data(), true);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(in, out);
  EXPECT_EQ(s.TakeAsyncErrors().size(), 1u);
  rt.Shutdown();  // before the daemons go
}

// A recovery first waits for the program to set its user events (a stream held by one would
// hold the recovery's Quiesce, and the program cannot set it while the recovery runs). A query
// the lost primary was to answer is asked of the survivor meanwhile, so a program that sets
// its event once the query is answered (as a CUDA host callback's thread does) goes on, and
// the takeover follows. Before, the query waited for the recovery, and the recovery, after
// its 10 s grace, for the held stream: for ever (a watchdog ends the test then).
TEST(UserEventRecovery, AQueryToALostPrimaryIsAnsweredWhileTheRecoveryWaits) {
  Watchdog watchdog(60s, "the recovery and the program wait on each other");
  test::Daemon a({}), b({}), c({});
  for (auto* daemon : {&a, &b, &c}) ASSERT_FALSE(daemon->address().empty());
  setenv("TANDEM_SERVERS", (a.address() + "," + b.address()).c_str(), 1);
  setenv("TANDEM_REDUNDANCY", "2", 1);
  setenv("TANDEM_SPARE_SERVERS", c.address().c_str(), 1);
  auto& rt = Runtime::Get();
  ASSERT_TRUE(rt.status().ok()) << rt.status().ToString();
  Device& dev = *rt.Devices(Api::kOpenCL).at(0);
  Session& s = *dev.session;
  const uint64_t user = rt.NewHandle(), held = rt.NewHandle();
  s.Post(ir::EventCreateReq{.event = user, .device = dev.remote_index, .flags = ir::kEventUser});
  s.Post(ir::EventCreateReq{.event = held, .device = dev.remote_index, .flags = 0});
  s.Post(ir::MarkerReq{.stream = 0, .barrier = 0, .wait = {user}, .signal = held});  // the stream waits for `user`
  ASSERT_TRUE(s.Flush().ok());
  a.Kill();
  auto query = s.Call(ir::EventQueryReq{.event = held});
  ASSERT_TRUE(query.ok()) << query.status().ToString();
  EXPECT_GT(query->status, 0) << "the marker cannot be complete: its user event is unset";
  s.Post(ir::UserEventSetReq{.event = user, .status = 0});
  Status st = s.Call(ir::DeviceSyncReq{.device = dev.remote_index}).status();
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The takeover runs once the event is set; the survivor may answer the sync before it ends.
  for (int i = 0; i < 200 && Stats::Get().migrations.load() == 0; ++i) std::this_thread::sleep_for(100ms);
  EXPECT_EQ(Stats::Get().migrations.load(), 1u);
  query = s.Call(ir::EventQueryReq{.event = held});
  ASSERT_TRUE(query.ok()) << query.status().ToString();
  EXPECT_EQ(query->status, 0);
  EXPECT_TRUE(s.TakeAsyncErrors().empty());
  rt.Shutdown();  // before the daemons go
}

TEST(Unreachable, GivesAClearErrorWithinTheTimeout) {
  // A port nobody listens on (bound and closed by the kernel's choice is racy; 1 is root-only
  // and never a tandemd).
  setenv("TANDEM_SERVERS", "127.0.0.1:1", 1);
  auto start = std::chrono::steady_clock::now();
  Status st = Runtime::Get().status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("127.0.0.1:1"), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_TRUE(Runtime::Get().Devices(Api::kOpenCL).empty());
}

}  // namespace
}  // namespace tandem::client

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
