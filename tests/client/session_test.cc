// Tier 1: the client session's batching, against an endpoint that only records what is
// sent (no network, no flusher thread): what leaves when is decided by the posting thread.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "session.h"
#include "tandem/ir/codec.h"

namespace tandem::client {
namespace {

using namespace std::chrono_literals;

// Records each message sent; everything else is refused (the session under test needs none).
class RecordingEndpoint final : public fabric::Endpoint {
 public:
  std::string provider() const override { return "recording"; }
  std::string address() const override { return "recording:0"; }
  uint16_t port() const override { return 0; }
  Result<fabric::PeerId> Connect(const std::string&, fabric::Millis) override { return Refused(); }
  void Close(fabric::PeerId) override {}
  Status Send(fabric::PeerId, std::vector<uint8_t> data) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(std::move(data));
    return Status::Ok();
  }
  Result<fabric::Event> Next(fabric::Micros) override { return Status(Code::kTimeout, "recording endpoint"); }
  void Interrupt() override {}
  void SetSpin(int) override {}
  Result<std::unique_ptr<fabric::MemoryRegion>> Register(void*, size_t, uint32_t) override { return Refused(); }
  Result<fabric::OpId> PostRead(fabric::PeerId, fabric::MemoryRegion&, size_t, const fabric::RemoteRegion&, uint64_t,
                                size_t) override {
    return Refused();
  }
  Result<fabric::OpId> PostWrite(fabric::PeerId, fabric::MemoryRegion&, size_t, const fabric::RemoteRegion&, uint64_t,
                                 size_t) override {
    return Refused();
  }
  Status Wait(fabric::OpId, fabric::Millis) override { return Refused(); }
  bool InFlight(fabric::OpId) override { return false; }

  // The records of each message sent so far.
  std::vector<std::vector<ir::Record>> Batches() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::vector<ir::Record>> out;
    for (const auto& msg : sent_) {
      std::vector<ir::Record> records;
      EXPECT_TRUE(ir::ParseBatch(msg, ir::BatchKind::kRequests, &records).ok());
      out.push_back(std::move(records));
    }
    return out;
  }

 private:
  static Status Refused() { return Status(Code::kUnimplemented, "recording endpoint"); }
  std::mutex mu_;
  std::vector<std::vector<uint8_t>> sent_;  // parsed records point into these: never erased
};

std::vector<uint8_t> LaunchPayload(uint64_t function) {
  return ir::Encode(ir::LaunchReq{.function = function, .dims = 1, .grid = {1}, .block = {1}});
}

constexpr auto kLaunch = static_cast<uint16_t>(ir::Opcode::kLaunch);

// A program that posts without pause never leaves the posting thread's lock to a flusher,
// so the posting thread itself must send a batch once its first command has waited the
// flush delay (100 us). Here there is no flusher at all: only the posts can send.
TEST(SessionBatching, ThePostingThreadSendsABatchThatWaitedTheFlushDelay) {
  RecordingEndpoint ep;
  int wakes = 0;
  SessionImpl s(&ep, 1, "recording", "", "opencl", [&wakes] { ++wakes; });
  s.PostRaw(kLaunch, LaunchPayload(1), nullptr);
  // Fresh: it waits for companions, and the flusher is asked to watch it.
  EXPECT_TRUE(ep.Batches().empty());
  EXPECT_EQ(wakes, 1);
  std::this_thread::sleep_for(5ms);  // well past the delay
  s.PostRaw(kLaunch, LaunchPayload(2), nullptr);
  auto batches = ep.Batches();
  ASSERT_EQ(batches.size(), 1u) << "the aged batch waited for a flusher that never came";
  ASSERT_EQ(batches[0].size(), 2u);
  EXPECT_EQ(batches[0][0].header.opcode, kLaunch);
  EXPECT_LT(batches[0][0].header.seq, batches[0][1].header.seq);
  // The next post starts a new batch, which again waits (and wakes the flusher once).
  s.PostRaw(kLaunch, LaunchPayload(3), nullptr);
  EXPECT_EQ(ep.Batches().size(), 1u);
  EXPECT_EQ(wakes, 2);
  ASSERT_TRUE(s.Flush().ok());
  batches = ep.Batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].size(), 1u);
}

// Liveness: a server is lost when it leaves a probe unanswered for the failover timeout. One
// that nobody asked anything for longer than that (the flusher, which pings every server, was
// held up by a send to a dead one) must get that long to answer the probe sent once the
// flusher is back, not be judged by the time since its last answer. (On the GPU machine under
// load the survivor of client_runtime.UserEventRecovery was declared lost so, its ping still
// on the way.)
TEST(SessionLiveness, SilenceCountsFromTheProbeNotFromTheLastAnswer) {
  RecordingEndpoint ep;
  SessionImpl s(&ep, 1, "recording", "", "opencl", [] {});
  const auto back = Clock::now() + FailoverTimeout() + 1s;  // not looked at for longer than the timeout
  s.Tick(back);
  auto batches = ep.Batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[0][0].header.opcode, static_cast<uint16_t>(ir::Opcode::kPing));
  s.Tick(back + 1ms);  // the ping's answer is not in yet: it was sent a millisecond ago
  EXPECT_TRUE(s.health().ok()) << s.health().ToString();
  s.Tick(back + FailoverTimeout() - 1ms);
  EXPECT_TRUE(s.health().ok()) << s.health().ToString();
  s.Tick(back + FailoverTimeout() + 1ms);  // unanswered for the whole timeout: lost
  EXPECT_FALSE(s.health().ok());
}

constexpr auto kStreamSync = static_cast<uint16_t>(ir::Opcode::kStreamSync);

// The flags of the one record of the newest batch sent.
uint16_t LastFlags(RecordingEndpoint& ep) {
  auto batches = ep.Batches();
  EXPECT_FALSE(batches.empty());
  if (batches.empty() || batches.back().size() != 1) {
    ADD_FAILURE() << "expected one record in the newest batch";
    return 0;
  }
  return batches.back()[0].header.flags;
}

// A wait the program's only posting thread makes (PostRawAwaited, as CallRaw does) tells the
// server that nothing else comes until its reply (kRecordCallerWaits), so the server may wait
// on its executor. A posted reply is no such wait, and once a second thread has posted to
// the session it may post during any later wait: never again.
TEST(SessionCallerWaits, OnlyAwaitedRepliesOfASessionWithOnePostingThread) {
  RecordingEndpoint ep;
  SessionImpl s(&ep, 1, "recording", "", "opencl", [] {});
  const std::vector<uint8_t> sync = ir::Encode(ir::StreamSyncReq{7});
  auto ignore = [](const Status&, std::span<const uint8_t>) {};
  s.PostRawAwaited(kStreamSync, sync, ignore);
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply | ir::kRecordCallerWaits);
  s.PostRaw(kStreamSync, sync, ignore);  // its reply runs a function; nobody waits for it
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply);
  // Pings and keepalive come from the runtime's own thread: they are not the program's.
  std::thread([&] {
    s.PostRaw(static_cast<uint16_t>(ir::Opcode::kPing), ir::Encode(ir::PingReq{1}), ignore);
    s.PostRaw(static_cast<uint16_t>(ir::Opcode::kWarm),
              ir::Encode(ir::WarmReq{.device = 0, .what = ir::kWarmCopy, .spin_us = 0, .data = ir::bytes(8, 0)}),
              ignore);
    ASSERT_TRUE(s.Flush().ok());
  }).join();
  s.PostRawAwaited(kStreamSync, sync, ignore);
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply | ir::kRecordCallerWaits);
  // A second thread's own first wait is not flagged: the first thread may post meanwhile.
  std::thread([&] {
    s.PostRawAwaited(kStreamSync, sync, ignore);
    ASSERT_TRUE(s.Flush().ok());
  }).join();
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply);
  // Nor, from then on, is any wait of the first thread's.
  s.PostRawAwaited(kStreamSync, sync, ignore);
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply);
}

// TANDEM_WAIT_IN_PLACE=0 turns the flag off (read once: checked in a fresh process, which
// the threadsafe death test style runs).
TEST(SessionCallerWaits, NoneWithWaitInPlaceOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TANDEM_WAIT_IN_PLACE", "0", 1);
        RecordingEndpoint ep;
        SessionImpl s(&ep, 1, "recording", "", "opencl", [] {});
        s.PostRawAwaited(kStreamSync, ir::Encode(ir::StreamSyncReq{7}), [](const Status&, std::span<const uint8_t>) {});
        (void)s.Flush();
        std::_Exit(LastFlags(ep) == ir::kRecordWantReply ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// What the front ends call (Session::Call, as OpenCL's clFinish does through CallOn) flags
// its command: CallRaw posts it as PostRawAwaited.
TEST(SessionCallerWaits, ACallIsFlagged) {
  RecordingEndpoint ep;
  SessionImpl s(&ep, 1, "recording", "", "opencl", [] {});
  std::thread caller([&] {
    auto r = s.Call(ir::StreamSyncReq{7});
    EXPECT_FALSE(r.ok());  // nobody answers: failed by the Close below
  });
  for (int i = 0; i < 2000 && ep.Batches().empty(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(LastFlags(ep), ir::kRecordWantReply | ir::kRecordCallerWaits);
  s.Close(Status(Code::kServerLost, "test: the call is over"));
  caller.join();
}

// Once the front end runs threads of its own (callbacks), no session marks a wait. The
// setting is for the whole process: checked in a child process of its own.
TEST(SessionCallerWaits, NoneOnceTheFrontEndRunsHelperThreads) {
  EXPECT_EXIT(
      {
        RecordingEndpoint ep;
        SessionImpl s(&ep, 1, "recording", "", "opencl", [] {});
        auto ignore = [](const Status&, std::span<const uint8_t>) {};
        s.PostRawAwaited(kStreamSync, ir::Encode(ir::StreamSyncReq{7}), ignore);
        (void)s.Flush();
        const bool before = LastFlags(ep) & ir::kRecordCallerWaits;
        NoteHelperThreads();
        s.PostRawAwaited(kStreamSync, ir::Encode(ir::StreamSyncReq{7}), ignore);
        (void)s.Flush();
        const bool after = LastFlags(ep) & ir::kRecordCallerWaits;
        std::_Exit(before && !after ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tandem::client
