// Feeds arbitrary server-to-server messages from one peer through FabricPeerLink::OnMessage,
// what a worker runs on every message another server sends it, with something of each kind
// waiting on that peer: a transfer offered to it (PeerPull, PeerPullRma, PeerRelease), one
// expected from it (PeerData, PeerRegion, PeerAbort), an event imported from it (PeerSignal)
// and one exported to it (PeerWatch). The endpoint only records: every connection is the one
// peer, a registration is a region of this process's memory, an RMA read completes at once
// without moving bytes. The input is a sequence of messages, each a 2-byte little-endian length
// and that many bytes; a message the link refuses ends the input, as the worker closes the peer.
// A blocking receive (Sink, a PeerRecv's) from that peer is open too: after the messages, it
// pulls what they left in its inbox and waits up to the link's timeout for the rest.
// After each message the harness waits until the link's sender and reader threads are idle
// (FabricPeerLink::WaitIdle), so an input always runs the same way. Checked: every message the
// link sends parses as a batch of server-to-server records; an RMA read stays inside the
// local region and the remote one it was given; the blocking receive hands on only bytes of
// its transfer, all of them when it succeeds; each outcome (the expected transfer's, the
// import's) comes exactly once, and the peer's loss at the end settles both.
// Not covered: a streaming source (Source, the executor reading the device chunk by chunk).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "peer_link.h"
#include "session_fuzz.h"
#include "tandem/ir/codec.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

constexpr fabric::PeerId kPeer = 7;
constexpr uint64_t kOffered = 1, kExpected = 2, kImported = 3, kExported = 4, kSunk = 6;
constexpr size_t kBytes = 64;
// The blocking receive's size: by message below kRmaMinBytes, by RMA from it (the input's
// length picks: even, small; odd, large).
constexpr size_t kSmallSink = 4096, kLargeSink = server::FabricPeerLink::kRmaMinBytes;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "peer_link_fuzz: check failed: %s\n", what);
  std::abort();
}

class Bytes final : public server::HostBuffer {
 public:
  explicit Bytes(size_t n) : b_(n, 0x3c) {}
  uint8_t* data() override { return b_.data(); }
  size_t size() const override { return b_.size(); }

 private:
  std::vector<uint8_t> b_;
};

class Region final : public fabric::MemoryRegion {
 public:
  Region(void* base, size_t len, uint64_t key) : base_(base), len_(len), key_(key) {}
  uint64_t remote_addr() const override { return reinterpret_cast<uintptr_t>(base_); }
  uint64_t key() const override { return key_; }
  void* base() const override { return base_; }
  size_t length() const override { return len_; }

 private:
  void* base_;
  size_t len_;
  uint64_t key_;
};

class RecordingEndpoint final : public fabric::Endpoint {
 public:
  std::string provider() const override { return "recording"; }
  std::string address() const override { return "recording:0"; }
  uint16_t port() const override { return 0; }
  Result<fabric::PeerId> Connect(const std::string&, fabric::Millis) override { return kPeer; }
  void Close(fabric::PeerId) override {}
  Status Send(fabric::PeerId peer, std::vector<uint8_t> data) override {
    Check(peer == kPeer, "Send: to the one peer");
    std::vector<ir::Record> records;
    Check(ir::ParseBatch(data, ir::BatchKind::kRequests, &records).ok() && !records.empty(), "Send: a batch");
    for (const ir::Record& r : records) {
      const ir::CommandInfo* info = ir::FindCommand(r.header.opcode);
      Check(info && (info->flags & ir::kPeer), "Send: server-to-server records only");
    }
    return Status::Ok();
  }
  Result<fabric::Event> Next(fabric::Micros) override { return Status(Code::kTimeout, "recording endpoint"); }
  void Interrupt() override {}
  void SetSpin(int) override {}
  Result<std::unique_ptr<fabric::MemoryRegion>> Register(void* addr, size_t len, uint32_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    return std::unique_ptr<fabric::MemoryRegion>(std::make_unique<Region>(addr, len, ++keys_));
  }
  Result<fabric::OpId> PostRead(fabric::PeerId peer, fabric::MemoryRegion& local, size_t local_offset,
                                const fabric::RemoteRegion& remote, uint64_t remote_offset, size_t len) override {
    Check(peer == kPeer, "PostRead: from the one peer");
    Check(local_offset <= local.length() && len <= local.length() - local_offset, "PostRead: inside the local region");
    Check(remote_offset <= remote.len && len <= remote.len - remote_offset, "PostRead: inside the remote region");
    std::lock_guard<std::mutex> lock(mu_);
    return ++ops_;
  }
  Result<fabric::OpId> PostWrite(fabric::PeerId, fabric::MemoryRegion&, size_t, const fabric::RemoteRegion&, uint64_t,
                                 size_t) override {
    return Status(Code::kUnimplemented, "recording endpoint");
  }
  Status Wait(fabric::OpId, fabric::Millis) override { return Status::Ok(); }
  bool InFlight(fabric::OpId) override { return false; }

 private:
  std::mutex mu_;
  uint64_t keys_ = 0;
  fabric::OpId ops_ = 0;
};

// Each outcome at most once.
struct Outcomes {
  std::mutex mu;
  int expected = 0, imported = 0;
};

std::vector<uint8_t> Message(const std::vector<uint8_t>& batch) {
  std::vector<uint8_t> out{static_cast<uint8_t>(batch.size() & 0xff), static_cast<uint8_t>(batch.size() >> 8)};
  out.insert(out.end(), batch.begin(), batch.end());
  return out;
}

template <class... Req>
std::vector<uint8_t> Batch(const Req&... reqs) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  uint64_t seq = 0;
  (w.AddRequest(reqs, ++seq), ...);
  return Message(w.Finish());
}

}  // namespace

std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  const std::vector<uint8_t> half(kBytes / 2, 0x11);
  auto seq = [](std::initializer_list<std::vector<uint8_t>> messages) {
    std::vector<uint8_t> s;
    for (const auto& m : messages) s.insert(s.end(), m.begin(), m.end());
    return s;
  };
  std::vector<std::vector<uint8_t>> seeds;
  // The offered transfer pulled by message, then by RMA and released; a pull of one unknown.
  seeds.push_back(seq({Batch(ir::PeerPullReq{kOffered, kBytes}), Batch(ir::PeerPullReq{99, kBytes})}));
  seeds.push_back(seq({Batch(ir::PeerPullRmaReq{kOffered, kBytes}), Batch(ir::PeerReleaseReq{kOffered})}));
  // The expected transfer in two PeerData chunks, then by one region, then aborted.
  seeds.push_back(seq({Batch(ir::PeerDataReq{kExpected, 0, half}, ir::PeerDataReq{kExpected, kBytes / 2, half})}));
  seeds.push_back(seq({Batch(ir::PeerRegionReq{kExpected, 0, 0x1000, kBytes, 5})}));
  seeds.push_back(seq({Batch(ir::PeerAbortReq{kExpected, static_cast<uint32_t>(Code::kApiError), "source failed"})}));
  // Events: the import answered, the export watched; and a watch of a token never exported.
  seeds.push_back(seq({Batch(ir::PeerSignalReq{kImported, 0}), Batch(ir::PeerWatchReq{kExported}),
                       Batch(ir::PeerWatchReq{77})}));
  // Rule breakers: data past the end, a region of the wrong size, a release of what was never
  // lent, a truncated batch.
  seeds.push_back(seq({Batch(ir::PeerDataReq{kExpected, kBytes - 4, half})}));
  seeds.push_back(seq({Batch(ir::PeerRegionReq{kExpected, 0, 0x1000, 2 * kBytes, 5}), Batch(ir::PeerReleaseReq{12345})}));
  // The blocking receive: by messages, whole (even length: the small one); by one region
  // (odd length, the trailing byte ignored: the large one).
  const std::vector<uint8_t> quarter(kSmallSink / 4, 0x22);
  std::vector<uint8_t> by_messages;
  for (uint64_t at = 0; at < kSmallSink; at += quarter.size()) {
    const auto m = Batch(ir::PeerDataReq{kSunk, at, quarter});
    by_messages.insert(by_messages.end(), m.begin(), m.end());
  }
  if (by_messages.size() % 2) by_messages.push_back(0);
  seeds.push_back(by_messages);
  std::vector<uint8_t> by_region = Batch(ir::PeerRegionReq{kSunk, 0, 0x2000, kLargeSink, 9});
  if (by_region.size() % 2 == 0) by_region.push_back(0);
  seeds.push_back(by_region);
  std::vector<uint8_t> cut = Batch(ir::PeerPullReq{kOffered, kBytes});
  cut.resize(cut.size() - 3);
  cut[0] = static_cast<uint8_t>(cut.size() - 2);
  seeds.push_back(cut);
  return seeds;
}

}  // namespace tandem::test

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  using namespace tandem::test;
  RecordingEndpoint ep;
  auto outcomes = std::make_shared<Outcomes>();
  {
    server::FabricPeerLink link(&ep, 5ms);
    link.Offer(kOffered, kBytes, std::shared_ptr<server::HostBuffer>(std::make_shared<Bytes>(kBytes)));
    auto into = std::make_shared<Bytes>(kBytes);
    Status st = link.Expect("peer:1", kExpected, into, [outcomes](const Status&) {
      std::lock_guard<std::mutex> lock(outcomes->mu);
      Check(++outcomes->expected == 1, "the expected transfer ends once");
    });
    Check(st.ok(), "Expect");
    st = link.Import("peer:1", kImported, [outcomes](int32_t) {
      std::lock_guard<std::mutex> lock(outcomes->mu);
      Check(++outcomes->imported == 1, "the import ends once");
    });
    Check(st.ok(), "Import");
    link.ExportDone(kExported, 0);
    const size_t sink_size = size % 2 ? kLargeSink : kSmallSink;
    auto sink = link.Sink("peer:1", kSunk, sink_size);
    Check(sink.ok(), "Sink");
    for (size_t at = 0; at + 2 <= size;) {
      const size_t len = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
      at += 2;
      const size_t n = len < size - at ? len : size - at;
      std::vector<uint8_t> message(data + at, data + at + n);
      at += n;
      const bool taken = link.OnMessage(kPeer, std::move(message));
      // What the message queued for the link's sender and reader threads (an answer to a
      // pull, a region to read) runs before the next one: the same input, the same run.
      Check(link.WaitIdle(std::chrono::seconds(5)), "the link's threads finish their work within 5 s");
      if (!taken) break;  // the worker refuses the peer
    }
    uint64_t got = 0;
    Status pulled = sink.value()->Pull({}, sink_size, [&](const uint8_t*, size_t offset, size_t n) {
      Check(offset <= sink_size && n <= sink_size - offset, "Pull: a chunk inside the transfer");
      got += n;
      Check(got <= sink_size, "Pull: no more bytes than the transfer's");
      return Status::Ok();
    });
    if (pulled.ok()) Check(got == sink_size, "Pull: a transfer received whole delivered every byte");
    sink.value().reset();
    link.OnPeerLost(kPeer, Status(Code::kLinkLost, "the input ended"));
  }
  std::lock_guard<std::mutex> lock(outcomes->mu);
  Check(outcomes->expected == 1, "the peer's loss ended the expected transfer");
  Check(outcomes->imported == 1, "the peer's loss ended the import");
  return 0;
}
