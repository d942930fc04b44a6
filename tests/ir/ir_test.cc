// Tier 1: the codec. Round trip of every command in the table (generated, so a new
// command is covered without editing this file), pinned wire sizes, and rejection of
// truncated, oversized and unknown messages.
#include <gtest/gtest.h>

#include <set>

#include "tandem/ir/codec.h"

namespace tandem::ir {
namespace {

// Fills every field with a value derived from a counter, so that a field dropped or
// swapped by the codec changes the re-encoded bytes.
struct Filler {
  uint64_t n = 1;
  size_t items = 2;  // elements of every list
  template <class T>
  void operator()(T& f, const char*) { Fill(f); }
  template <class T>
    requires std::is_integral_v<T>
  void Fill(T& v) { v = static_cast<T>(n++ * 0x0101010101010101ull); }
  void Fill(f64& v) { v = static_cast<double>(n++) + 0.5; }
  void Fill(str& s) { s = "s" + std::to_string(n++); }
  void Fill(bytes& b) { b.assign(3 + n % 5 + (items > 2 ? 16 : 0), static_cast<uint8_t>(n)); ++n; }
  template <class T>
  void Fill(std::vector<T>& v) {
    v.resize(items);
    for (auto& e : v) Fill(e);
  }
  template <class T>
    requires requires(T& t, Filler& f) { VisitFields(t, f); }
  void Fill(T& s) { VisitFields(s, *this); }
};

TEST(Codec, EveryCommandRoundTrips) {
  int n = 0;
  ForEachCommand([&]<class Req>() {
    ++n;
    Req req;
    Filler f;
    VisitFields(req, f);
    auto wire = Encode(req);
    Req back;
    ASSERT_TRUE(DecodeRequest(wire, &back).ok()) << Req::kName;
    EXPECT_EQ(Encode(back), wire) << Req::kName;

    typename Req::Reply rep;
    VisitFields(rep, f);
    BatchWriter bw(BatchKind::kReplies);
    bw.AddReply(static_cast<uint16_t>(Req::kOpcode), 7, Status::Ok(), {}, &rep);
    auto msg = bw.Finish();
    std::vector<Record> recs;
    ASSERT_TRUE(ParseBatch(msg, BatchKind::kReplies, &recs).ok());
    ASSERT_EQ(recs.size(), 1u);
    ReplyHead head;
    typename Req::Reply rep_back;
    ASSERT_TRUE(DecodeReply(recs[0].payload, &head, &rep_back).ok()) << Req::kName;
    EXPECT_TRUE(head.status.ok());
    EXPECT_EQ(Encode(rep_back), Encode(rep)) << Req::kName;
  });
  EXPECT_EQ(static_cast<size_t>(n), kCommandCount);
}

// Decoding into a request that held another one (the server reuses its Launch request)
// gives what decoding into a fresh one gives: longer lists are cut, every field overwritten.
TEST(Codec, DecodingIntoAUsedRequestGivesAFreshOnesResult) {
  ForEachCommand([&]<class Req>() {
    Req small, large;
    Filler fs{.n = 1, .items = 2}, fl{.n = 1000, .items = 5};
    VisitFields(small, fs);
    VisitFields(large, fl);
    const auto small_wire = Encode(small), large_wire = Encode(large);
    Req used;
    ASSERT_TRUE(DecodeRequest(large_wire, &used).ok()) << Req::kName;
    ASSERT_TRUE(DecodeRequest(small_wire, &used).ok()) << Req::kName;
    EXPECT_EQ(Encode(used), small_wire) << Req::kName << ": after a larger one";
    ASSERT_TRUE(DecodeRequest(large_wire, &used).ok()) << Req::kName;
    EXPECT_EQ(Encode(used), large_wire) << Req::kName << ": after a smaller one";
  });
}

TEST(Codec, OpcodesAreUniqueAndNamed) {
  std::set<uint16_t> seen;
  for (const auto& c : kCommands) {
    EXPECT_TRUE(seen.insert(static_cast<uint16_t>(c.opcode)).second) << c.name;
    EXPECT_EQ(FindCommand(static_cast<uint16_t>(c.opcode))->name, c.name);
    // A command is either always answered or asynchronous, never both.
    EXPECT_NE(!!(c.flags & kNeedsReply), !!(c.flags & kAsync)) << c.name;
  }
  EXPECT_EQ(FindCommand(0xFFFF), nullptr);
  EXPECT_EQ(CommandName(0xFFFF), "Unknown");
}

// Wire sizes are pinned: a change here is a protocol change and needs a version bump.
TEST(Codec, PinnedWireSizes) {
  EXPECT_EQ(Encode(PingReq{}).size(), 8u);
  EXPECT_EQ(Encode(BufferAllocReq{}).size(), 40u);
  EXPECT_EQ(Encode(BufferFreeReq{}).size(), 8u);
  // stream buffer offset size | data(4) | region(24) | wait(4) | signal
  EXPECT_EQ(Encode(BufferWriteReq{}).size(), 32u + 4 + 24 + 4 + 8);
  EXPECT_EQ(Encode(HelloReq{}).size(), 4u + 4 + 8 + 4 + 4);
  BatchWriter bw(BatchKind::kRequests);
  bw.AddRequest(PingReq{.nonce = 1}, 1);
  EXPECT_EQ(bw.Finish().size(), kBatchHeaderSize + kRecordHeaderSize + 8);
  // Little-endian, explicitly.
  auto wire = Encode(PingReq{.nonce = 0x0102030405060708ull});
  EXPECT_EQ(wire, (std::vector<uint8_t>{8, 7, 6, 5, 4, 3, 2, 1}));
}

// A bulk tail filled in place encodes exactly as the same request with its bytes.
TEST(Codec, RequestWithTailMatchesRequestWithBytes) {
  ir::bytes data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  ir::BatchWriter plain(ir::BatchKind::kRequests), tail(ir::BatchKind::kRequests);
  plain.AddRequest(ir::PeerDataReq{0x1234, 4096, data}, 9);
  uint8_t* into = tail.AddRequestWithTail(ir::PeerDataReq{0x1234, 4096, {}}, data.size(), 9);
  std::copy(data.begin(), data.end(), into);
  EXPECT_EQ(plain.Finish(), tail.Finish());
}

TEST(Codec, RejectsTruncatedMessages) {
  BufferWriteReq req{.stream = 1, .buffer = 2, .offset = 3, .size = 4, .data = {1, 2, 3, 4}};
  auto wire = Encode(req);
  for (size_t cut = 0; cut < wire.size(); ++cut) {
    BufferWriteReq back;
    EXPECT_FALSE(DecodeRequest(std::span<const uint8_t>(wire.data(), cut), &back).ok()) << cut;
  }
  wire.push_back(0);
  BufferWriteReq back;
  EXPECT_FALSE(DecodeRequest(wire, &back).ok()) << "trailing byte accepted";
}

TEST(Codec, RejectsOversizedCounts) {
  // A bytes field claiming 4 GiB, with 4 bytes behind it.
  std::vector<uint8_t> wire(32, 0);
  Writer w(&wire);
  w.PutInt(uint32_t{0xFFFFFFFF});
  w.PutInt(uint32_t{0});
  BufferWriteReq back;
  Status st = DecodeRequest(wire, &back);
  EXPECT_EQ(st.code(), Code::kProtocol);
  // A list whose count exceeds what the message can hold.
  std::vector<uint8_t> list;
  Writer lw(&list);
  lw.PutInt(uint32_t{1000});
  EventWaitReq ew;
  EXPECT_FALSE(DecodeRequest(list, &ew).ok());
}

TEST(Codec, RejectsBadFraming) {
  BatchWriter bw(BatchKind::kRequests);
  bw.AddRequest(PingReq{.nonce = 5}, 9);
  auto msg = bw.Finish();
  std::vector<Record> recs;
  ASSERT_TRUE(ParseBatch(msg, BatchKind::kRequests, &recs).ok());
  EXPECT_EQ(recs[0].header.seq, 9u);
  EXPECT_EQ(recs[0].header.opcode, static_cast<uint16_t>(Opcode::kPing));

  auto bad = msg;
  bad[0] ^= 1;  // magic
  EXPECT_EQ(ParseBatch(bad, BatchKind::kRequests, &recs).code(), Code::kProtocol);
  bad = msg;
  bad[4] = 99;  // version
  EXPECT_EQ(ParseBatch(bad, BatchKind::kRequests, &recs).code(), Code::kProtocol);
  EXPECT_EQ(ParseBatch(msg, BatchKind::kReplies, &recs).code(), Code::kProtocol);
  bad = msg;
  bad[kBatchHeaderSize + 4] = 0xFF;  // record length beyond the message
  EXPECT_EQ(ParseBatch(bad, BatchKind::kRequests, &recs).code(), Code::kProtocol);
  for (size_t cut = 0; cut < msg.size(); ++cut)
    EXPECT_FALSE(ParseBatch(std::span<const uint8_t>(msg.data(), cut), BatchKind::kRequests, &recs).ok());
}

TEST(Codec, ErrorReplyCarriesStatusAndDeferredErrors) {
  BatchWriter bw(BatchKind::kReplies);
  std::vector<AsyncError> deferred{{.seq = 3, .opcode = 0x0401, .code = 2, .native = -5, .message = "bad launch"}};
  bw.AddReply<PingRep>(0x0004, 4, Status::Native(Api::kOpenCL, -30, "invalid value"), deferred, nullptr);
  auto msg = bw.Finish();
  std::vector<Record> recs;
  ASSERT_TRUE(ParseBatch(msg, BatchKind::kReplies, &recs).ok());
  ReplyHead head;
  PingRep rep;
  ASSERT_TRUE(DecodeReply(recs[0].payload, &head, &rep).ok());
  EXPECT_EQ(head.status.code(), Code::kApiError);
  EXPECT_EQ(head.status.native(), -30);
  EXPECT_EQ(head.status.api(), Api::kOpenCL);
  ASSERT_EQ(head.deferred.size(), 1u);
  EXPECT_EQ(head.deferred[0].message, "bad launch");
}

TEST(Trace, RendersFieldsByName) {
  auto wire = Encode(BufferAllocReq{.buffer = 5, .device = 0, .size = 4096});
  std::string t = TraceRequest(0x0201, wire);
  EXPECT_NE(t.find("BufferAlloc("), std::string::npos) << t;
  EXPECT_NE(t.find("size=4096"), std::string::npos) << t;
  EXPECT_NE(TraceRequest(0x7777, {}).find("Unknown"), std::string::npos);
}

}  // namespace
}  // namespace tandem::ir
