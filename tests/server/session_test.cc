// Tier 1: the session layer over the in-memory backend: authentication, the generated
// dispatch table's defined answers, malformed input, deferred asynchronous errors, failed
// signal events, pings and output notifications.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "memory_backend.h"
#include "tandem/server/session.h"

namespace tandem::server {
namespace {

constexpr uint64_t kKey = 0xfeedface;

struct Reply {
  ir::RecordHeader header;
  ir::ReplyHead head;
  std::vector<uint8_t> fields;
};

std::vector<Reply> Parse(const std::vector<uint8_t>& msg) {
  std::vector<ir::Record> records;
  Status st = ir::ParseBatch(msg, ir::BatchKind::kReplies, &records);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<Reply> out;
  for (const auto& r : records) {
    Reply rep{r.header, {}, {}};
    if (r.header.seq != 0 || r.header.opcode != static_cast<uint16_t>(ir::Opcode::kOutput)) {
      ir::Reader rd(r.payload);
      EXPECT_TRUE(ir::DecodeReplyHead(rd, &rep.head).ok());
      rep.fields.assign(rd.cursor(), rd.cursor() + rd.remaining());
    } else {
      rep.fields.assign(r.payload.begin(), r.payload.end());
    }
    out.push_back(std::move(rep));
  }
  return out;
}

class SessionTest : public ::testing::Test {
 protected:
  void Attach() {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::AttachReq{kKey}, 1);
    BatchOutcome out = session_.HandleBatch(w.Finish());
    ASSERT_FALSE(out.refuse_peer);
    auto replies = Parse(out.reply);
    ASSERT_EQ(replies.size(), 1u);
    ASSERT_TRUE(replies[0].head.status.ok()) << replies[0].head.status.ToString();
  }
  std::vector<Reply> Run(ir::BatchWriter& w) {
    BatchOutcome out = session_.HandleBatch(w.Finish());
    return out.reply.empty() ? std::vector<Reply>{} : Parse(out.reply);
  }

  test::MemoryBackend backend_;
  Session session_{&backend_, kKey};
};

TEST_F(SessionTest, FirstRequestMustBeAttachWithTheKey) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 1);
  BatchOutcome out = session_.HandleBatch(w.Finish());
  EXPECT_TRUE(out.refuse_peer);
  EXPECT_EQ(Parse(out.reply)[0].head.status.code(), Code::kAuth);
  EXPECT_EQ(backend_.calls, 0);

  w.AddRequest(ir::AttachReq{kKey + 1}, 2);
  out = session_.HandleBatch(w.Finish());
  EXPECT_TRUE(out.refuse_peer);
  EXPECT_FALSE(session_.attached());

  out = session_.HandleBatch(std::vector<uint8_t>{1, 2, 3});
  EXPECT_TRUE(out.refuse_peer);
  Attach();
  EXPECT_TRUE(session_.attached());
}

TEST_F(SessionTest, MalformedInputGetsClearErrorsAndTheSessionGoesOn) {
  Attach();
  // Garbage, a wrong magic and a truncated batch: one error record each.
  for (std::vector<uint8_t> bad : {std::vector<uint8_t>{0xde, 0xad}, std::vector<uint8_t>(16, 0)}) {
    auto r = Parse(session_.HandleBatch(bad).reply);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].head.status.code(), Code::kProtocol);
  }
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PingReq{1}, 5);
  std::vector<uint8_t> good = w.Finish();
  std::vector<uint8_t> truncated(good.begin(), good.end() - 3);
  auto r = Parse(session_.HandleBatch(truncated).reply);
  EXPECT_EQ(r[0].head.status.code(), Code::kProtocol);
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0);
  r = Parse(session_.HandleBatch(trailing).reply);
  EXPECT_EQ(r[0].head.status.code(), Code::kProtocol);

  // Per record: an unknown opcode, a broker command, a short and an overlong payload,
  // a server-to-client notification. Each is answered even though some are async.
  w.AddRaw(0x7777, 0, 10, {});
  w.AddRequest(ir::HelloReq{ir::kMagic, ir::kProtocolVersion, 0, "", ""}, 11);
  w.AddRaw(static_cast<uint16_t>(ir::Opcode::kBufferAlloc), 0, 12, std::vector<uint8_t>(5, 0));
  w.AddRaw(static_cast<uint16_t>(ir::Opcode::kPing), 0, 13, std::vector<uint8_t>(9, 0));
  w.AddRequest(ir::OutputReq{1, {}}, 14);
  w.AddRequest(ir::PingReq{77}, 15);
  r = Run(w);
  ASSERT_EQ(r.size(), 6u);
  EXPECT_EQ(r[0].head.status.code(), Code::kUnimplemented);
  EXPECT_NE(r[0].head.status.message().find("0x7777"), std::string::npos);
  EXPECT_EQ(r[1].head.status.code(), Code::kProtocol);
  EXPECT_NE(r[1].head.status.message().find("broker"), std::string::npos);
  EXPECT_EQ(r[2].head.status.code(), Code::kProtocol);
  EXPECT_NE(r[2].head.status.message().find("malformed BufferAlloc"), std::string::npos);
  EXPECT_EQ(r[3].head.status.code(), Code::kProtocol);
  EXPECT_NE(r[3].head.status.message().find("trailing bytes"), std::string::npos);
  EXPECT_EQ(r[4].head.status.code(), Code::kProtocol);
  EXPECT_TRUE(r[5].head.status.ok());
  EXPECT_EQ(r[5].header.seq, 15u);
  EXPECT_EQ(backend_.calls, 0);
}

// One request message may ask for at most Session::kMaxInlineReplyBytes of read backs carried
// in replies: its reply batch counts bytes in 32 bits, and the worker would hold them all
// (the review's: 17 reads of 256 MiB made a reply the client rejected whole).
TEST_F(SessionTest, InlineReadBacksOfOneMessageAreBounded) {
  Attach();
  constexpr uint64_t kQuarter = Session::kMaxInlineReplyBytes / 4;
  ir::BatchWriter w(ir::BatchKind::kRequests);
  // Of a buffer that does not exist: each fails in the backend, allocating nothing, and counts.
  for (uint64_t seq = 20; seq < 24; ++seq)
    w.AddRequest(ir::BufferReadReq{.stream = 0, .buffer = 0x999, .offset = 0, .size = kQuarter}, seq);
  w.AddRequest(ir::BufferReadReq{.stream = 0, .buffer = 0x999, .offset = 0, .size = 1}, 24);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(r[i].head.status.ok()) << i;  // the backend's answer: no such buffer
    EXPECT_NE(r[i].head.status.code(), Code::kOverload) << i;
  }
  EXPECT_EQ(r[4].head.status.code(), Code::kOverload);
  EXPECT_NE(r[4].head.status.message().find("at most"), std::string::npos) << r[4].head.status.ToString();
  // The next message starts afresh.
  w.AddRequest(ir::BufferReadReq{.stream = 0, .buffer = 0x999, .offset = 0, .size = 1}, 25);
  r = Run(w);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].head.status.ok());
  EXPECT_NE(r[0].head.status.code(), Code::kOverload);
}

TEST_F(SessionTest, AsyncFailuresAreDeferredToTheNextReply) {
  Attach();
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 20);
  w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 21);  // live handle: fails, no reply
  w.AddRequest(ir::BufferCopyReq{0, 1, 8, 1, 0, 16, {}, 30}, 22);  // out of range, signal 30
  EXPECT_TRUE(Run(w).empty());
  // Want-reply turns an async command's result into a reply of its own.
  w.AddRequest(ir::BufferFreeReq{99}, 23, ir::kRecordWantReply);
  w.AddRequest(ir::DeviceSyncReq{0}, 24);
  w.AddRequest(ir::DeviceSyncReq{0}, 25);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].head.status.code(), Code::kUnknownHandle);
  ASSERT_EQ(r[0].head.deferred.size(), 2u);
  EXPECT_EQ(r[0].head.deferred[0].seq, 21u);
  EXPECT_EQ(r[0].head.deferred[0].opcode, static_cast<uint32_t>(ir::Opcode::kBufferAlloc));
  EXPECT_EQ(r[0].head.deferred[1].seq, 22u);
  EXPECT_EQ(r[0].head.deferred[1].signal, 30u);
  EXPECT_EQ(r[0].head.deferred[1].code, static_cast<uint32_t>(Code::kInvalidArgument));
  EXPECT_TRUE(r[1].head.deferred.empty());  // delivered once
  EXPECT_TRUE(r[2].head.status.ok());
}

TEST_F(SessionTest, FailedSignalsAnswerQueriesAndFailTheirWaiters) {
  Attach();
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 1);
  w.AddRequest(ir::BufferWriteReq{0, 1, 0, 4, {1, 2, 3, 4}, {}, {}, 40}, 2);       // ok: event 40
  w.AddRequest(ir::BufferWriteReq{0, 1, 14, 4, {1, 2, 3, 4}, {}, {}, 41}, 3);      // fails: event 41
  w.AddRequest(ir::BufferFillReq{0, 1, 0, 16, {7}, {41}, 42}, 4);                  // waits on 41: fails
  w.AddRequest(ir::EventQueryReq{41}, 5);
  w.AddRequest(ir::EventWaitReq{{40, 41, 42}}, 6);
  w.AddRequest(ir::EventDestroyReq{41}, 7, ir::kRecordWantReply);
  w.AddRequest(ir::EventQueryReq{41}, 8);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 4u);
  ASSERT_EQ(r[0].head.deferred.size(), 2u);
  EXPECT_NE(r[0].head.deferred[1].message.find("waits on event 41"), std::string::npos);
  // The write failed by itself, the fill for what it waited on; both on stream 0 here.
  EXPECT_EQ(r[0].head.deferred[0].waited, 0u);
  EXPECT_EQ(r[0].head.deferred[1].waited, 1u);
  EXPECT_EQ(r[0].head.deferred[1].signal, 42u);
  ir::EventQueryRep q;
  ir::Reader rd(r[0].fields);
  ASSERT_TRUE(ir::Get(rd, &q));
  EXPECT_LT(q.status, 0);
  ir::EventWaitRep ew;
  ir::Reader rd2(r[1].fields);
  ASSERT_TRUE(ir::Get(rd2, &ew));
  ASSERT_EQ(ew.statuses.size(), 3u);
  EXPECT_EQ(ew.statuses[0], 0);
  EXPECT_LT(ew.statuses[1], 0);
  EXPECT_LT(ew.statuses[2], 0);
  EXPECT_TRUE(r[2].head.status.ok());                           // destroying a failed event
  EXPECT_EQ(r[3].head.status.code(), Code::kUnknownHandle);     // then it is gone
}

TEST_F(SessionTest, PingsAreAnsweredOffTheExecutorOnlyWhenAlone) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PingReq{5}, 1);
  std::vector<uint8_t> ping = w.Finish();
  EXPECT_FALSE(session_.RunUrgent(ping).has_value());  // not attached yet
  Attach();
  auto pong = session_.RunUrgent(ping);
  ASSERT_TRUE(pong.has_value());
  auto r = Parse(*pong);
  ASSERT_EQ(r.size(), 1u);
  ir::PingRep p;
  ir::Reader rd(r[0].fields);
  ASSERT_TRUE(ir::Get(rd, &p));
  EXPECT_EQ(p.nonce, 5u);
  w.AddRequest(ir::PingReq{6}, 2);
  w.AddRequest(ir::DeviceSyncReq{0}, 3);
  EXPECT_FALSE(session_.RunUrgent(w.Finish()).has_value());
}

TEST_F(SessionTest, OutputPrecedesTheRepliesOfItsBatch) {
  Attach();
  backend_.pending_output = {{1, "hello from a kernel\n"}};
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::DeviceSyncReq{0}, 9);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].header.opcode, static_cast<uint16_t>(ir::Opcode::kOutput));
  EXPECT_EQ(r[0].header.seq, 0u);
  ir::OutputReq o;
  ASSERT_TRUE(ir::DecodeRequest(r[0].fields, &o).ok());
  EXPECT_EQ(std::string(o.data.begin(), o.data.end()), "hello from a kernel\n");
  EXPECT_EQ(r[1].header.seq, 9u);
}

TEST_F(SessionTest, DeferredErrorsAreBounded) {
  Attach();
  ir::BatchWriter w(ir::BatchKind::kRequests);
  for (int i = 0; i < 300; ++i) w.AddRequest(ir::BufferFreeReq{1000u + i}, 100 + i);
  w.AddRequest(ir::DeviceSyncReq{0}, 9);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].head.deferred.size(), Session::kMaxDeferred + 1);
  EXPECT_NE(r[0].head.deferred.back().message.find("44 more"), std::string::npos);
}

TEST_F(SessionTest, GoodbyeEndsTheBatch) {
  Attach();
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::GoodbyeReq{}, 1);
  w.AddRequest(ir::DeviceSyncReq{0}, 2);
  BatchOutcome out = session_.HandleBatch(w.Finish());
  EXPECT_TRUE(out.goodbye);
  EXPECT_TRUE(out.reply.empty());
}

// A backend whose synchronize defers its reply and notes whether the session said that the
// deferred wait runs next (Backend::set_wait_runs_next).
class DeferringBackend : public test::MemoryBackend {
 public:
  std::vector<bool> seen;
  bool alone = false;       // EnqueuedCompleteAlone
  int waits_run = 0;        // deferred waits that ran
  Status wait_status;       // what each returns
  bool in_place_seen = false;  // WaitRunsInPlace, during the last synchronize
  bool in_place_only = false;  // the synchronize's wait says it runs in place only
  Status OnStreamSync(const ir::StreamSyncReq&, ir::StreamSyncRep*) override {
    seen.push_back(wait_runs_next());
    in_place_seen = WaitRunsInPlace();
    return ReplyLater(DeferredWait{[this] {
                                     ++waits_run;
                                     return wait_status;
                                   },
                                   nullptr, in_place_only});
  }
  bool EnqueuedCompleteAlone() const override { return alone; }
  // An event wait deferred as OpenCL's is: every event answers 0 once the wait runs.
  Status OnEventWait(const ir::EventWaitReq& req, ir::EventWaitRep* rep) override {
    return ReplyLater(
        [this, n = req.events.size(), rep] {
          ++waits_run;
          rep->statuses.assign(n, 0);
          return wait_status;
        },
        nullptr);
  }
};

// Only the last command of a batch, with no late reply before it and the waiter idle, is
// told that its wait runs next: anything else must flush before deferring.
TEST(SessionWaitRunsNext, OnlyTheLastCommandWithAnIdleWaiter) {
  DeferringBackend backend;
  Session session(&backend, kKey, /*defer_replies=*/true);
  bool idle = true;
  auto run = [&](std::vector<ir::StreamSyncReq> syncs, bool attach_first) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    uint64_t seq = 1;
    if (attach_first) w.AddRequest(ir::AttachReq{kKey}, seq++);
    for (const auto& s : syncs) w.AddRequest(s, seq++);
    backend.seen.clear();
    return session.HandleBatch(w.Finish()).late.size();
  };
  // No waiter_idle yet: never.
  EXPECT_EQ(run({ir::StreamSyncReq{0}}, true), 1u);
  EXPECT_EQ(backend.seen, std::vector<bool>{false});
  session.set_waiter_idle([&] { return idle; });
  EXPECT_EQ(run({ir::StreamSyncReq{0}}, false), 1u);
  EXPECT_EQ(backend.seen, std::vector<bool>{true});
  // Two deferred replies: the first is not last, the second has one before it.
  EXPECT_EQ(run({ir::StreamSyncReq{0}, ir::StreamSyncReq{0}}, false), 2u);
  EXPECT_EQ(backend.seen, (std::vector<bool>{false, false}));
  // Outside a batch (after one whose last command was told) the backend is not told.
  EXPECT_EQ(run({ir::StreamSyncReq{0}}, false), 1u);
  ir::StreamSyncRep rep;
  ASSERT_TRUE(backend.OnStreamSync({0}, &rep).ok());
  EXPECT_EQ(backend.seen, (std::vector<bool>{true, false}));
  (void)backend.TakeDeferredReply();
  idle = false;
  EXPECT_EQ(run({ir::StreamSyncReq{0}}, false), 1u);
  EXPECT_EQ(backend.seen, std::vector<bool>{false});
}

// A deferred wait that the client waits for alone (kRecordCallerWaits) and that would run
// next, with nothing enqueued waiting on the session, runs in place and its reply leaves with
// the batch (its status included); otherwise it goes to the waiter.
TEST(SessionWaitInPlace, OnlyWhenTheClientWaitsAloneItRunsNextAndNothingWaitsOnTheSession) {
  DeferringBackend backend;
  Session session(&backend, kKey, /*defer_replies=*/true);
  session.set_waiter_idle([] { return true; });
  auto run = [&](int syncs, bool attach_first, uint16_t flags = ir::kRecordCallerWaits) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    uint64_t seq = 1;
    if (attach_first) w.AddRequest(ir::AttachReq{kKey}, seq++);
    for (int i = 0; i < syncs; ++i) w.AddRequest(ir::StreamSyncReq{0}, 100 + i, flags);
    backend.waits_run = 0;
    return session.HandleBatch(w.Finish());
  };
  auto replies = [](const BatchOutcome& out) {
    std::vector<ir::Record> records;
    if (!out.reply.empty()) {
      EXPECT_TRUE(ir::ParseBatch(out.reply, ir::BatchKind::kReplies, &records).ok());
    }
    return records;
  };
  // The backend says a wait may need the session: the waiter, as before, and a reply that
  // may block (a side thread of LateReplies).
  BatchOutcome out = run(1, true);
  ASSERT_EQ(out.late.size(), 1u);
  EXPECT_TRUE(out.late[0].may_block);
  EXPECT_EQ(backend.waits_run, 0);
  EXPECT_FALSE(backend.in_place_seen);
  backend.alone = true;
  // The client did not say it waits alone (a second thread posts, or callbacks run): the
  // waiter, so that the other thread's commands do not queue behind this wait.
  out = run(1, false, 0);
  ASSERT_EQ(out.late.size(), 1u);
  EXPECT_FALSE(out.late[0].may_block);
  EXPECT_EQ(backend.waits_run, 0);
  EXPECT_FALSE(backend.in_place_seen);
  out = run(1, false);
  EXPECT_TRUE(out.late.empty());
  EXPECT_EQ(backend.waits_run, 1);
  EXPECT_TRUE(backend.in_place_seen);  // the backend knew, and could wait as in place only
  // A wait the backend made for in place only runs there, whatever the session would decide.
  backend.in_place_only = true;
  out = run(1, false, 0);
  EXPECT_TRUE(out.late.empty());
  EXPECT_EQ(backend.waits_run, 1);
  backend.in_place_only = false;
  auto r = replies(out);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].header.seq, 100u);
  ir::ReplyHead head;
  ir::StreamSyncRep rep;
  ASSERT_TRUE(ir::DecodeReply(r[0].payload, &head, &rep).ok());
  EXPECT_TRUE(head.status.ok());
  // A failed wait's status is the reply's.
  backend.wait_status = Status(Code::kApiError, "test: the wait failed");
  out = run(1, false);
  EXPECT_TRUE(out.late.empty());
  r = replies(out);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(ir::DecodeReply(r[0].payload, &head, &rep).ok());
  EXPECT_EQ(head.status.code(), Code::kApiError);
  backend.wait_status = Status::Ok();
  // Two in a batch: the first does not run next, and the second follows a late one.
  out = run(2, false);
  EXPECT_EQ(out.late.size(), 2u);
  EXPECT_EQ(backend.waits_run, 0);
  // A busy waiter: its earlier replies go first.
  session.set_waiter_idle([] { return false; });
  out = run(1, false);
  EXPECT_EQ(out.late.size(), 1u);
  EXPECT_EQ(backend.waits_run, 0);
}

}  // namespace
}  // namespace tandem::server

namespace tandem::server {
namespace {

// Another server, as a session's holding sees it: transfers and imports it answers when the
// test says so.
class FakePeers : public PeerLink {
 public:
  struct Expected {
    std::shared_ptr<HostBuffer> into;
    std::function<void(const Status&)> done;
  };
  std::map<uint64_t, Expected> expected;                       // by transfer
  std::map<uint64_t, std::function<void(int32_t)>> imported;  // by token

  Result<std::unique_ptr<BulkIO>> Source(uint64_t, uint64_t) override { return Status(Code::kUnimplemented, "fake"); }
  Result<std::unique_ptr<BulkIO>> Sink(const std::string&, uint64_t, uint64_t) override {
    return Status(Code::kUnimplemented, "fake");
  }
  void ExportDone(uint64_t, int32_t) override {}
  Status Import(const std::string&, uint64_t token, std::function<void(int32_t)> done) override {
    imported[token] = std::move(done);
    return Status::Ok();
  }
  void Offer(uint64_t, uint64_t, Result<std::shared_ptr<HostBuffer>>) override {}
  Status Expect(const std::string&, uint64_t transfer, std::shared_ptr<HostBuffer> into,
                std::function<void(const Status&)> done) override {
    expected[transfer] = Expected{std::move(into), std::move(done)};
    return Status::Ok();
  }
  // The bytes of `transfer` come: all `fill`.
  void Arrive(uint64_t transfer, uint8_t fill) {
    Expected& x = expected.at(transfer);
    std::fill_n(x.into->data(), x.into->size(), fill);
    x.done(Status::Ok());
  }
};

class SessionHoldTest : public SessionTest {
 protected:
  void SetUp() override {
    session_.set_hold(true);
    session_.set_peers(&peers_);
    Attach();
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 2);
    ASSERT_TRUE(Run(w).empty());
  }
  std::vector<uint8_t> Read(uint64_t stream, uint64_t seq) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::BufferReadReq{stream, 1, 0, 16, {}, {}, 0}, seq);
    auto r = Run(w);
    EXPECT_EQ(r.size(), 1u);
    if (r.size() != 1) return {};
    EXPECT_TRUE(r[0].head.status.ok()) << r[0].head.status.ToString();
    ir::BufferReadRep rep;
    ir::Reader rd(r[0].fields);
    EXPECT_TRUE(ir::Get(rd, &rep));
    return rep.data;
  }
  int32_t Query(uint64_t event, uint64_t seq) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::EventQueryReq{event}, seq);
    auto r = Run(w);
    EXPECT_EQ(r.size(), 1u);
    ir::EventQueryRep q;
    ir::Reader rd(r.at(0).fields);
    EXPECT_TRUE(ir::Get(rd, &q));
    return q.status;
  }
  // The deferred errors a device synchronize's reply carries.
  std::vector<ir::AsyncError> Deferred(uint64_t seq) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::DeviceSyncReq{0}, seq);
    auto r = Run(w);
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? std::vector<ir::AsyncError>{} : r[0].head.deferred;
  }
  FakePeers peers_;
};

std::vector<uint8_t> Bytes(std::initializer_list<std::pair<int, uint8_t>> runs) {
  std::vector<uint8_t> v;
  for (auto [n, b] : runs) v.insert(v.end(), n, b);
  return v;
}

// An event wait the backend defers, over events some of which failed in the session: the
// failed ones answer from the session, in their places, once the backend's wait has run.
TEST(SessionEventWait, FailedEventsMergeIntoADeferredWaitsReply) {
  DeferringBackend backend;
  Session session(&backend, kKey, /*defer_replies=*/true);
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::AttachReq{kKey}, 1);
  w.AddRequest(ir::BufferAllocReq{1, 0, 16, 0, 0}, 2);
  w.AddRequest(ir::BufferWriteReq{0, 1, 0, 4, {1, 2, 3, 4}, {}, {}, 40}, 3);   // ok: event 40
  w.AddRequest(ir::BufferWriteReq{0, 1, 14, 4, {1, 2, 3, 4}, {}, {}, 41}, 4);  // fails: event 41
  w.AddRequest(ir::EventWaitReq{{41, 40, 41}}, 5);
  BatchOutcome out = session.HandleBatch(w.Finish());
  ASSERT_EQ(out.late.size(), 1u);  // not attached before this batch: never in place
  EXPECT_EQ(backend.waits_run, 0);
  const std::vector<uint8_t> batch = out.late[0]();
  EXPECT_EQ(backend.waits_run, 1);
  std::vector<ir::Record> records;
  ASSERT_TRUE(ir::ParseBatch(batch, ir::BatchKind::kReplies, &records).ok());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].header.seq, 5u);
  ir::ReplyHead head;
  ir::EventWaitRep rep;
  ASSERT_TRUE(ir::DecodeReply(records[0].payload, &head, &rep).ok());
  ASSERT_TRUE(head.status.ok());
  ASSERT_EQ(rep.statuses.size(), 3u);
  EXPECT_LT(rep.statuses[0], 0);
  EXPECT_EQ(rep.statuses[1], 0);
  EXPECT_LT(rep.statuses[2], 0);
}

}  // namespace

// A keepalive that finds commands held for another server keeps its spin window and leaves
// the device to the program's work in flight; once nothing is held it warms the device again.
TEST_F(SessionHoldTest, WarmLeavesTheDeviceAloneWhileCommandsAreHeld) {
  std::vector<uint32_t> spins;
  session_.set_spin_hook([&](uint32_t us) { spins.push_back(us); });
  auto warm = [&](uint64_t seq) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::WarmReq{.device = 0, .what = ir::kWarmCopy, .spin_us = 3000, .data = ir::bytes(8, 0x5a)}, seq);
    auto r = Run(w);
    EXPECT_EQ(r.size(), 1u);
    if (r.size() != 1) return ir::bytes{};
    EXPECT_TRUE(r[0].head.status.ok()) << r[0].head.status.ToString();
    ir::WarmRep rep;
    ir::Reader rd(r[0].fields);
    EXPECT_TRUE(ir::Get(rd, &rep));
    return rep.data;
  };
  EXPECT_EQ(warm(30), ir::bytes(8, 0x5a));
  EXPECT_EQ(backend_.warms, 1);
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PeerRecvReq{5, 1, 0, 4, "peer:1", 78, {}, 52}, 31);
  EXPECT_TRUE(Run(w).empty());
  ASSERT_EQ(session_.held(), 1u);
  EXPECT_TRUE(warm(32).empty());
  EXPECT_EQ(backend_.warms, 1) << "warmed the device while a transfer's write was held";
  peers_.Arrive(78, 5);
  EXPECT_TRUE(session_.RunReleased().reply.empty());
  EXPECT_EQ(session_.held(), 0u);
  EXPECT_EQ(warm(33), ir::bytes(8, 0x5a));
  EXPECT_EQ(backend_.warms, 2);
  EXPECT_EQ(spins, (std::vector<uint32_t>{3000, 3000, 3000}));
}

// A copy's destination half and what follows it on its stream stay in the session until the
// bytes come, then run in program order; another stream goes on meanwhile.
TEST_F(SessionHoldTest, StreamWaitsForTheBytesThenRunsInOrder) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PeerRecvReq{5, 1, 0, 4, "peer:1", 77, {}, 50}, 10);
  w.AddRequest(ir::BufferFillReq{5, 1, 0, 8, {9}, {}, 51}, 11);         // after the write: wins on [0, 4)
  w.AddRequest(ir::BufferWriteReq{6, 1, 12, 4, {1, 2, 3, 4}, {}, {}, 0}, 12);  // another stream
  EXPECT_TRUE(Run(w).empty());
  EXPECT_EQ(session_.held(), 2u);
  EXPECT_EQ(Query(51, 13), ir::kEventQueued);
  EXPECT_EQ(Read(6, 14), Bytes({{12, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}}));
  peers_.Arrive(77, 5);
  EXPECT_TRUE(session_.RunReleased().reply.empty());
  EXPECT_EQ(session_.held(), 0u);
  EXPECT_EQ(Read(5, 15), Bytes({{8, 9}, {4, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}}));
  EXPECT_EQ(Query(50, 16), ir::kEventComplete);
}

// A command waiting on an imported event stays until the other server answers; a read that
// needs it waits on the executor for the answer, and a free waits for what is held.
TEST_F(SessionHoldTest, ImportHoldsItsWaitersAndAReadWaitsForTheAnswer) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::EventImportReq{60, 0, "peer:1", 99}, 20);
  w.AddRequest(ir::BufferFillReq{7, 1, 0, 16, {3}, {60}, 61}, 21);
  w.AddRequest(ir::BufferAllocReq{2, 0, 16, 0, 0}, 22);
  w.AddRequest(ir::BufferFreeReq{2}, 23);  // after the held fill
  EXPECT_TRUE(Run(w).empty());
  EXPECT_EQ(session_.held(), 2u);
  ASSERT_TRUE(peers_.imported.contains(99));
  std::thread answer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    peers_.imported.at(99)(0);
  });
  EXPECT_EQ(Read(7, 24), Bytes({{16, 3}}));  // blocks until the answer, then the fill ran
  answer.join();
  EXPECT_EQ(session_.held(), 0u);
  w.AddRequest(ir::BufferFreeReq{2}, 25, ir::kRecordWantReply);
  auto r = Run(w);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].head.status.code(), Code::kUnknownHandle);  // the held free ran
  EXPECT_TRUE(r[0].head.deferred.empty());
}

// While the session holds (an import unanswered), a deferred wait stays off the executor even
// when the backend has nothing waiting on it: the answer is the executor's to run.
TEST(SessionWaitInPlace, NotWhileTheSessionHolds) {
  DeferringBackend backend;
  backend.alone = true;
  FakePeers peers;
  Session session(&backend, kKey, /*defer_replies=*/true);
  session.set_hold(true);
  session.set_peers(&peers);
  session.set_waiter_idle([] { return true; });
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::AttachReq{kKey}, 1);
  w.AddRequest(ir::EventImportReq{60, 0, "peer:1", 99}, 2);
  w.AddRequest(ir::StreamSyncReq{0}, 3, ir::kRecordCallerWaits);
  BatchOutcome out = session.HandleBatch(w.Finish());
  EXPECT_EQ(out.late.size(), 1u);
  EXPECT_EQ(backend.waits_run, 0);
  ASSERT_TRUE(peers.imported.contains(99));
  peers.imported.at(99)(0);
  session.RunReleased();
  w.AddRequest(ir::StreamSyncReq{0}, 4, ir::kRecordCallerWaits);
  out = session.HandleBatch(w.Finish());
  EXPECT_TRUE(out.late.empty());
  EXPECT_EQ(backend.waits_run, 1);
}

// Bytes that never come fail the write and its signal, and so what waits on it; both are
// reported with the next reply.
TEST_F(SessionHoldTest, FailedTransferFailsItsSignalAndItsWaiters) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PeerRecvReq{5, 1, 0, 4, "peer:1", 78, {}, 70}, 30);
  w.AddRequest(ir::BufferFillReq{8, 1, 8, 8, {4}, {70}, 71}, 31);
  EXPECT_TRUE(Run(w).empty());
  EXPECT_EQ(session_.held(), 2u);
  peers_.expected.at(78).done(Status(Code::kLinkLost, "the source server is gone"));
  session_.RunReleased();
  EXPECT_EQ(session_.held(), 0u);
  auto d = Deferred(32);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].seq, 30u);
  EXPECT_EQ(d[0].signal, 70u);
  EXPECT_NE(d[1].message.find("waits on event 70"), std::string::npos);
  EXPECT_LT(Query(71, 33), 0);
  EXPECT_EQ(Read(5, 34), Bytes({{16, 0}}));  // nothing was written
}

// An import answered with a failure fails what waited on it, as a failed command's signal
// does, and answers queries with the other server's status.
TEST_F(SessionHoldTest, FailedImportFailsItsWaiters) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::EventImportReq{62, 0, "peer:1", 98}, 40);
  w.AddRequest(ir::BufferFillReq{9, 1, 0, 16, {6}, {62}, 63}, 41);
  EXPECT_TRUE(Run(w).empty());
  EXPECT_EQ(session_.held(), 1u);
  EXPECT_EQ(Query(62, 42), ir::kEventQueued);
  peers_.imported.at(98)(-5);
  session_.RunReleased();
  EXPECT_EQ(session_.held(), 0u);
  auto d = Deferred(43);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].seq, 41u);
  EXPECT_NE(d[0].message.find("waits on event 62"), std::string::npos);
  EXPECT_EQ(Query(62, 44), -5);
  EXPECT_LT(Query(63, 45), 0);
  EXPECT_EQ(Read(9, 46), Bytes({{16, 0}}));  // the fill never ran
}

}  // namespace tandem::server
