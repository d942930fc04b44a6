// FabricPeerLink between two worker endpoints on 127.0.0.1 (tcp), in one process: an
// asynchronous transfer goes by one RMA read of the source's host copy, which the source
// lets go once the puller releases it; a source that streams from the device still feeds an
// asynchronous puller; and a puller that misbehaves (a region of the wrong size, a release
// of what it was never lent, a link that drops) fails only its own transfer.
#include "peer_link.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>

#include "tandem/ir/codec.h"

namespace tandem::server {
namespace {

using namespace std::chrono_literals;

class VectorBuffer final : public HostBuffer {
 public:
  explicit VectorBuffer(size_t n, uint8_t fill = 0) : bytes_(n, fill) {}
  uint8_t* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

std::shared_ptr<HostBuffer> Pattern(size_t n, uint8_t seed) {
  auto b = std::make_shared<VectorBuffer>(n);
  uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;  // no period a chunk or a ring could hide in
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b->data()[i] = static_cast<uint8_t>(x >> 56);
  }
  return b;
}

// One worker: a listening endpoint, its peer link, and the thread that feeds the link what
// the endpoint receives (as a worker's receive loop does).
struct Worker {
  std::unique_ptr<fabric::Endpoint> ep;
  std::unique_ptr<FabricPeerLink> link;
  std::thread pump;
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0};

  explicit Worker(fabric::Millis timeout = 5000ms) {
    fabric::Options o;
    o.provider = "tcp";
    o.listen = "127.0.0.1:0";
    auto opened = fabric::Endpoint::Open(o);
    if (!opened.ok()) throw std::runtime_error(opened.status().ToString());
    ep = std::move(opened).value();
    link = std::make_unique<FabricPeerLink>(ep.get(), timeout);
    pump = std::thread([this] {
      while (!stop) {
        auto ev = ep->Next(20ms);
        if (!ev.ok()) continue;
        if (ev->kind == fabric::EventKind::kPeerLost) link->OnPeerLost(ev->peer, ev->status);
        else if (!link->OnMessage(ev->peer, std::move(ev->data))) ++refused;
      }
    });
  }
  ~Worker() {
    stop = true;
    pump.join();
    link.reset();
  }
};

// Expect on `to` from the worker at `from`: the future gets the transfer's outcome.
std::future<Status> ExpectFrom(Worker& to, const std::string& from, uint64_t transfer, std::shared_ptr<HostBuffer> into) {
  auto outcome = std::make_shared<std::promise<Status>>();
  std::future<Status> f = outcome->get_future();
  Status st = to.link->Expect(from, transfer, std::move(into), [outcome](const Status& s) { outcome->set_value(s); });
  if (!st.ok()) outcome->set_value(st);
  return f;
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5000ms) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

TEST(PeerLink, AsynchronousTransferIsOneRmaReadThenReleased) {
  Worker src, dst;
  // Offered before and after the pull; small (one PeerData message) and larger than one RMA
  // chunk and one message.
  for (size_t n : {size_t{1} << 10, size_t{5} << 20}) {
    for (bool offer_first : {true, false}) {
      const uint64_t transfer = 0x1000 + n + offer_first;
      auto bytes = Pattern(n, static_cast<uint8_t>(transfer));
      auto into = std::make_shared<VectorBuffer>(n, 0xee);
      if (offer_first) src.link->Offer(transfer, n, bytes);
      auto done = ExpectFrom(dst, src.ep->address(), transfer, into);
      if (!offer_first) src.link->Offer(transfer, n, bytes);
      ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
      ASSERT_TRUE(done.get().ok());
      EXPECT_EQ(std::memcmp(into->data(), bytes->data(), n), 0) << n << " bytes";
    }
  }
  EXPECT_EQ(dst.link->rma_reads(), 2u) << "the 5 MiB transfers, not the 1 KiB ones (a message)";
  EXPECT_TRUE(WaitFor([&] { return src.link->lent() == 0; })) << "the source keeps bytes the puller released";
  EXPECT_EQ(src.refused + dst.refused, 0);
}

TEST(PeerLink, StreamingSourceFeedsAnAsynchronousPullerChunkByChunk) {
  Worker src, dst;
  const size_t n = (9u << 20) + 123;  // three chunks of the blocking path
  auto bytes = Pattern(n, 7);
  auto into = std::make_shared<VectorBuffer>(n);
  auto done = ExpectFrom(dst, src.ep->address(), 42, into);
  auto io = src.link->Source(42, n);  // waits for the pull
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  ASSERT_TRUE(io.value()
                  ->Push({}, n,
                         [&](uint8_t* chunk, size_t offset, size_t len) {
                           std::memcpy(chunk, bytes->data() + offset, len);
                           return Status::Ok();
                         })
                  .ok());
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  ASSERT_TRUE(done.get().ok());
  EXPECT_EQ(std::memcmp(into->data(), bytes->data(), n), 0);
  EXPECT_EQ(dst.link->rma_reads(), 3u) << "one region per ring chunk";
}

// The executor's sink (PeerRecv's blocking path) pulls from a streaming source (a ring of
// regions), from an asynchronous one (one region, read a chunk at a time) and, below the RMA
// size, by messages.
TEST(PeerLink, StreamingSinkReadsEitherSourceAndSmallOnesByMessage) {
  Worker src, dst;
  uint64_t reads = 0;
  for (int kind = 0; kind < 3; ++kind) {
    const size_t n = kind == 2 ? 64u << 10 : (33u << 20) + 5;  // twice the ring, and more
    const uint64_t transfer = 0x500 + kind;
    auto bytes = Pattern(n, static_cast<uint8_t>(kind));
    std::thread source;
    if (kind == 1) {
      src.link->Offer(transfer, n, bytes);
    } else {
      source = std::thread([&, transfer, n] {
        auto io = src.link->Source(transfer, n);
        ASSERT_TRUE(io.ok()) << io.status().ToString();
        EXPECT_TRUE(io.value()
                        ->Push({}, n,
                               [&](uint8_t* chunk, size_t offset, size_t len) {
                                 std::memcpy(chunk, bytes->data() + offset, len);
                                 return Status::Ok();
                               })
                        .ok());
      });
    }
    auto io = dst.link->Sink(src.ep->address(), transfer, n);
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    std::vector<uint8_t> got(n, 0xee);
    size_t next = 0;
    Status st = io.value()->Pull({}, n, [&](const uint8_t* chunk, size_t offset, size_t len) {
      // A slow device: the source must not refill a ring slot before its region was read.
      std::this_thread::sleep_for(20ms);
      EXPECT_EQ(offset, next);
      std::memcpy(got.data() + offset, chunk, len);
      next = offset + len;
      return Status::Ok();
    });
    if (source.joinable()) source.join();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(std::memcmp(got.data(), bytes->data(), n), 0) << "kind " << kind;
    reads += kind == 2 ? 0 : 9;  // 33 MiB + 5 in 4 MiB chunks
    EXPECT_EQ(dst.link->rma_reads(), reads) << "kind " << kind;
  }
  EXPECT_TRUE(WaitFor([&] { return src.link->lent() == 0; }));
  EXPECT_EQ(src.refused + dst.refused, 0);
}

// A sink that fails (the device write) stops its streaming source at once, not at the
// source's timeout for the ring's releases.
TEST(PeerLink, FailingSinkStopsItsStreamingSource) {
  Worker src(30000ms), dst(30000ms);
  const size_t n = 64u << 20;
  auto bytes = Pattern(n, 9);
  Status pushed;
  std::thread source([&] {
    auto io = src.link->Source(77, n);
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    pushed = io.value()->Push({}, n, [&](uint8_t* chunk, size_t offset, size_t len) {
      std::memcpy(chunk, bytes->data() + offset, len);
      return Status::Ok();
    });
  });
  auto io = dst.link->Sink(src.ep->address(), 77, n);
  ASSERT_TRUE(io.ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status st = io.value()->Pull({}, n, [&](const uint8_t*, size_t offset, size_t) {
    return offset < (8u << 20) ? Status::Ok() : Status(Code::kApiError, "the device write failed");
  });
  source.join();
  EXPECT_EQ(st.code(), Code::kApiError);
  EXPECT_FALSE(pushed.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "the source waited for its timeout: " << pushed.ToString();
}

// Either side may be far behind the other (its stream busy): an asynchronous transfer waits
// for its source however long that takes (the advection example on four PoCL servers failed
// every run when pullers gave up after the timeout).
TEST(PeerLink, AsynchronousPullerWaitsForASourceFarBehind) {
  Worker src(300ms), dst(300ms);
  const size_t n = 1u << 20;
  auto bytes = Pattern(n, 5);
  auto into = std::make_shared<VectorBuffer>(n);
  auto done = ExpectFrom(dst, src.ep->address(), 11, into);
  EXPECT_EQ(done.wait_for(1s), std::future_status::timeout) << "the puller gave up on a source that lives";
  src.link->Offer(11, n, bytes);
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  EXPECT_EQ(std::memcmp(into->data(), bytes->data(), n), 0);
}

// A source whose blocking PeerSend gave up waiting for its pull answers the late pull with
// PeerAbort: the puller fails at once, with the reason.
TEST(PeerLink, LatePullOfATransferThatFailedIsAborted) {
  Worker src(300ms), dst(300ms);
  auto io = src.link->Source(12, 4096);
  ASSERT_FALSE(io.ok());
  EXPECT_EQ(io.status().code(), Code::kTimeout);
  auto done = ExpectFrom(dst, src.ep->address(), 12, std::make_shared<VectorBuffer>(4096));
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  Status st = done.get();
  EXPECT_EQ(st.code(), Code::kApiError) << st.ToString();
  EXPECT_NE(st.message().find("no server pulled"), std::string::npos) << st.ToString();
}

// A blocking source whose backend fails before its read (the PeerSource is dropped unused)
// still answers its asynchronous puller, which has no deadline of its own.
TEST(PeerLink, SourceThatFailsBeforeItsReadAbortsThePuller) {
  Worker src, dst;
  auto done = ExpectFrom(dst, src.ep->address(), 13, std::make_shared<VectorBuffer>(4096));
  {
    auto io = src.link->Source(13, 4096);
    ASSERT_TRUE(io.ok()) << io.status().ToString();
  }  // dropped: the backend's read failed before it began
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(done.get().code(), Code::kApiError);
}

// A raw listening endpoint that speaks to a worker's link as a misbehaving peer would.
struct RawPeer {
  std::unique_ptr<fabric::Endpoint> ep;
  RawPeer() {
    auto opened = fabric::Endpoint::Open(fabric::Options{.provider = "tcp", .listen = "127.0.0.1:0"});
    if (!opened.ok()) throw std::runtime_error(opened.status().ToString());
    ep = std::move(opened).value();
  }
  template <class Req>
  void Send(fabric::PeerId to, const Req& req) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(req, 0);
    ASSERT_TRUE(ep->Send(to, w.Finish()).ok());
  }
  // The next message, whose first record must be a Req: its sender, or 0.
  template <class Req>
  fabric::PeerId Receive(Req* out) {
    for (;;) {
      auto ev = ep->Next(5000ms);
      if (!ev.ok()) return 0;
      if (ev->kind != fabric::EventKind::kMessage) continue;
      std::vector<ir::Record> records;
      if (!ir::ParseBatch(ev->data, ir::BatchKind::kRequests, &records).ok() || records.empty()) return 0;
      if (records[0].header.opcode != static_cast<uint16_t>(Req::kOpcode)) return 0;
      return ir::DecodeRequest(records[0].payload, out).ok() ? ev->peer : 0;
    }
  }
};

TEST(PeerLink, BadRegionsAndReleasesFailOnlyTheirOwnTransfer) {
  Worker dst;
  RawPeer source;
  // A region that is not the transfer's size: that transfer fails, and is released.
  const size_t n = FabricPeerLink::kRmaMinBytes;
  auto into = std::make_shared<VectorBuffer>(n);
  auto done = ExpectFrom(dst, source.ep->address(), 1, into);
  ir::PeerPullRmaReq pull;
  const fabric::PeerId puller = source.Receive(&pull);
  ASSERT_NE(puller, 0u);
  EXPECT_EQ(pull.transfer, 1u);
  EXPECT_EQ(pull.size, n);
  std::vector<uint8_t> bytes(2 * n, 0x11);
  auto region = source.ep->Register(bytes.data(), bytes.size(), fabric::kRemoteRead);
  ASSERT_TRUE(region.ok());
  source.Send(puller, ir::PeerRegionReq{1, 0, region.value()->remote_addr(), 2 * n, region.value()->key()});
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  Status st = done.get();
  EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
  ir::PeerReleaseReq release;
  EXPECT_EQ(source.Receive(&release), puller);
  EXPECT_EQ(release.transfer, 1u);

  // A region for a transfer nobody expects, and a release of something never lent: a
  // release back, and nothing else.
  source.Send(puller, ir::PeerRegionReq{99, 0, region.value()->remote_addr(), n, region.value()->key()});
  EXPECT_EQ(source.Receive(&release), puller);
  EXPECT_EQ(release.transfer, 99u);
  source.Send(puller, ir::PeerReleaseReq{12345});

  // The next transfer from the same peer is read by RMA as it should be.
  auto good = ExpectFrom(dst, source.ep->address(), 2, into);
  ASSERT_EQ(source.Receive(&pull), puller);
  source.Send(puller, ir::PeerRegionReq{2, 0, region.value()->remote_addr(), n, region.value()->key()});
  ASSERT_EQ(good.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(good.get().ok());
  EXPECT_EQ(into->data()[0], 0x11);
  EXPECT_EQ(into->data()[n - 1], 0x11);
  EXPECT_EQ(dst.link->rma_reads(), 1u);
  EXPECT_EQ(dst.refused, 0) << "bad regions and releases fail their transfer, not the peer";
}

// A peer refused for a malformed message is closed, which raises no kPeerLost on this side:
// the transfer expected from it fails at once instead of waiting for ever, and so does a
// later one from the same address until it is connected again.
TEST(PeerLink, MalformedMessageFailsWhatWaitsOnThatPeer) {
  Worker dst;
  RawPeer source;
  auto done = ExpectFrom(dst, source.ep->address(), 1, std::make_shared<VectorBuffer>(4096));
  ir::PeerPullReq pull;
  const fabric::PeerId puller = source.Receive(&pull);
  ASSERT_NE(puller, 0u);
  ASSERT_TRUE(source.ep->Send(puller, {0xde, 0xad, 0xbe, 0xef}).ok());
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready) << "the transfer still waits on a refused peer";
  Status st = done.get();
  EXPECT_EQ(st.code(), Code::kLinkLost) << st.ToString();
  EXPECT_NE(st.message().find("malformed"), std::string::npos) << st.ToString();
  // The transfer fails inside OnMessage, before it answers false and the worker counts the
  // refusal: wait for the count rather than read it at once.
  for (int i = 0; i < 500 && dst.refused.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(dst.refused, 1);
}

// A blocking source whose puller asked for another size fails, and tells the puller so.
TEST(PeerLink, BlockingSourceOfAnotherSizeAbortsThePuller) {
  Worker src, dst;
  auto done = ExpectFrom(dst, src.ep->address(), 21, std::make_shared<VectorBuffer>(2048));
  auto io = src.link->Source(21, 4096);
  ASSERT_FALSE(io.ok());
  EXPECT_EQ(io.status().code(), Code::kInvalidArgument) << io.status().ToString();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready) << "the puller was never told";
  EXPECT_FALSE(done.get().ok());
}

TEST(PeerLink, BytesLentToAPullerThatVanishesAreLetGo) {
  Worker src;
  const size_t n = 1u << 20;
  src.link->Offer(7, n, Pattern(n, 3));
  {
    auto puller = std::make_unique<RawPeer>();
    auto to = puller->ep->Connect(src.ep->address(), 5000ms);
    ASSERT_TRUE(to.ok());
    puller->Send(to.value(), ir::PeerPullRmaReq{7, n});
    ir::PeerRegionReq region;
    ASSERT_EQ(puller->Receive(&region), to.value());
    EXPECT_EQ(region.len, n);
    EXPECT_EQ(src.link->lent(), 1u);
  }  // the puller's endpoint closes without a release
  EXPECT_TRUE(WaitFor([&] { return src.link->lent() == 0; }, 15000ms));
}

}  // namespace
}  // namespace tandem::server
