// Tier 3: a real tandemd on 127.0.0.1 (OpenCL backend on PoCL), driven by the minimal test
// client: a good session end to end, refused tokens, malformed batches, bad and foreign
// handles, and a client that vanishes in the middle of a large RMA write.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <thread>

#include "daemon.h"
#include "test_client.h"

namespace tandem::test {
namespace {

constexpr const char* kScaleSource =
    "__kernel void scale(__global int* a, int k) { size_t i = get_global_id(0); a[i] = a[i] * k; }\n";
constexpr size_t kBig = 8u << 20;

ir::BufferWriteReq InlineWrite(uint64_t buffer, const std::vector<uint8_t>& data) {
  ir::BufferWriteReq w;
  w.buffer = buffer;
  w.size = data.size();
  w.data = data;
  return w;
}

ir::Region RegionOf(const fabric::MemoryRegion& mr) { return ir::Region{mr.remote_addr(), mr.length(), mr.key()}; }

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
  return v;
}

// Builds the scale kernel in a session and returns its function handle.
void BuildScale(TestClient& c, fabric::PeerId w, uint64_t module, uint64_t function) {
  ir::BatchWriter b(ir::BatchKind::kRequests);
  std::string src = kScaleSource;
  b.AddRequest(ir::ModuleLoadReq{module, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLSource),
                                 ir::bytes(src.begin(), src.end())},
               c.next_seq());
  b.AddRequest(ir::ModuleBuildReq{module, ""}, c.next_seq());
  b.AddRequest(ir::FunctionGetReq{function, module, "scale"}, c.next_seq(), ir::kRecordWantReply);
  ReplyBatch r = c.Exchange(w, b.Finish());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.records.size(), 2u);
  auto build = TestClient::Decode<ir::ModuleBuildReq>(r, 0);
  ASSERT_TRUE(build.status().ok()) << build.status().ToString();
  ASSERT_EQ(build.rep.status, 0) << build.rep.log;
  auto fn = TestClient::Decode<ir::FunctionGetReq>(r, 1);
  ASSERT_TRUE(fn.status().ok()) << fn.status().ToString();
  EXPECT_EQ(fn.rep.info.num_params, 2u);
}

// Writes, scales and reads back `n` ints through a session; true when the data is right.
void RoundTrip(TestClient& c, fabric::PeerId w, uint64_t base, size_t bytes) {
  const uint64_t buf = base + 1, module = base + 2, function = base + 3;
  std::vector<uint8_t> host = Pattern(bytes, static_cast<uint8_t>(base));
  std::vector<uint8_t> back(bytes);
  auto src = c.ep().Register(host.data(), host.size(), fabric::kRemoteRead);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  auto dst = c.ep().Register(back.data(), back.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(dst.ok()) << dst.status().ToString();
  BuildScale(c, w, module, function);

  ir::BatchWriter b(ir::BatchKind::kRequests);
  b.AddRequest(ir::BufferAllocReq{buf, 0, bytes, 0, 0}, c.next_seq());
  ir::BufferWriteReq wr;
  wr.buffer = buf;
  wr.size = bytes;
  wr.remote = RegionOf(*src.value());
  b.AddRequest(wr, c.next_seq());
  ir::LaunchReq l;
  l.function = function;
  l.dims = 1;
  l.grid = {bytes / 4};
  int32_t k = 3;
  l.args = {ir::LaunchArg{static_cast<uint32_t>(ir::ArgKind::kBuffer), buf, {}},
            ir::LaunchArg{static_cast<uint32_t>(ir::ArgKind::kBytes), 0,
                          ir::bytes(reinterpret_cast<uint8_t*>(&k), reinterpret_cast<uint8_t*>(&k) + 4)}};
  b.AddRequest(l, c.next_seq());
  ir::BufferReadReq rd;
  rd.buffer = buf;
  rd.size = bytes;
  rd.remote = RegionOf(*dst.value());
  b.AddRequest(rd, c.next_seq());
  ReplyBatch r = c.Exchange(w, b.Finish());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.records.size(), 1u);
  auto read = TestClient::Decode<ir::BufferReadReq>(r);
  ASSERT_TRUE(read.status().ok()) << read.status().ToString();
  EXPECT_TRUE(read.head.deferred.empty()) << read.head.deferred[0].message;
  for (size_t i = 0; i < bytes / 4; ++i) {
    int32_t in, out;
    std::memcpy(&in, host.data() + 4 * i, 4);
    std::memcpy(&out, back.data() + 4 * i, 4);
    ASSERT_EQ(out, static_cast<int32_t>(static_cast<uint32_t>(in) * 3u)) << "at int " << i;
  }
}

uint32_t LiveSessions(TestClient& c, fabric::PeerId broker, const std::string& token = "") {
  auto st = c.Call(broker, ir::ServerStatusReq{token});
  EXPECT_TRUE(st.status().ok()) << st.status().ToString();
  return st.rep.sessions;
}

TEST(Tandemd, GoodSessionEndToEnd) {
  Daemon d({});
  ASSERT_FALSE(d.address().empty());
  TestClient c;
  auto s = OpenSession(c, d.address());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GE(s->attach.device_count, 1u);
  EXPECT_NE(s->attach.backend.find("opencl"), std::string::npos);
  EXPECT_NE(s->hello.session_key, 0u);

  // 8 MiB by RMA both ways, through a kernel.
  RoundTrip(c, s->worker, 0x100, kBig);

  // A small write and read, inline.
  std::vector<uint8_t> small = Pattern(4096, 9);
  ir::BatchWriter b(ir::BatchKind::kRequests);
  b.AddRequest(ir::BufferAllocReq{0x200, 0, small.size(), 0, 0}, c.next_seq());
  b.AddRequest(InlineWrite(0x200, small), c.next_seq());
  b.AddRequest(ir::BufferReadReq{0, 0x200, 0, small.size(), {}, {}, 0}, c.next_seq());
  auto read = TestClient::Decode<ir::BufferReadReq>(c.Exchange(s->worker, b.Finish()));
  ASSERT_TRUE(read.status().ok()) << read.status().ToString();
  EXPECT_EQ(read.rep.data, small);

  auto info = c.Call(s->worker, ir::DeviceInfoReq{0});
  ASSERT_TRUE(info.status().ok()) << info.status().ToString();
  EXPECT_FALSE(info.rep.name.empty());
  EXPECT_GT(info.rep.props.size(), 50u);

  EXPECT_EQ(LiveSessions(c, s->broker), 1u);
  ir::BatchWriter bye(ir::BatchKind::kRequests);
  bye.AddRequest(ir::GoodbyeReq{}, c.next_seq());
  ASSERT_TRUE(c.ep().Send(s->worker, bye.Finish()).ok());
  for (int i = 0; i < 100 && LiveSessions(c, s->broker) != 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(LiveSessions(c, s->broker), 0u);
}


std::string WriteTokenFile(const std::string& token) {
  std::string path = fmt::format("{}/token-{}", TANDEM_TEST_TMP, ::getpid());
  std::ofstream(path) << token << "\n";
  return path;
}

TEST(Tandemd, WrongOrMissingTokenIsRefusedAndTheLinkClosed) {
  Daemon d({"--token-file", WriteTokenFile("s3cret")});
  ASSERT_FALSE(d.address().empty());
  EXPECT_NE(d.Log().find("token required"), std::string::npos);
  for (const std::string token : {"wrong", ""}) {
    TestClient c;
    auto broker = c.Connect(d.address());
    ASSERT_TRUE(broker.ok()) << broker.status().ToString();
    auto h = c.Call(broker.value(),
                    ir::HelloReq{ir::kMagic, ir::kProtocolVersion, 0, token, "intruder"});
    EXPECT_EQ(h.status().code(), Code::kAuth) << h.status().ToString();
    EXPECT_NE(h.status().message().find("wrong or missing token"), std::string::npos);
    // The broker closed the link: nothing more is answered on it.
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(ir::ServerStatusReq{"s3cret"}, 2);
    Status sent = c.ep().Send(broker.value(), w.Finish());
    if (sent.ok()) {
      EXPECT_FALSE(c.Receive(broker.value(), 1500ms).status.ok());
    }
  }
  // ServerStatus is token-checked too; the right token opens a session.
  TestClient c;
  auto s = OpenSession(c, d.address(), "s3cret");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(LiveSessions(c, s->broker, "s3cret"), 1u);
}

// A server bounds the workers it forks: one Hello per message, and --max-sessions live.
TEST(Tandemd, SessionsAreBounded) {
  Daemon d({"--max-sessions", "1"});
  ASSERT_FALSE(d.address().empty());
  TestClient c;
  auto broker = c.Connect(d.address());
  ASSERT_TRUE(broker.ok());
  ir::HelloReq hello{ir::kMagic, ir::kProtocolVersion, ir::kFeatureOpenCL, "", "bounded"};
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(hello, 1);
  w.AddRequest(hello, 2);
  ReplyBatch r = c.Exchange(broker.value(), w.Finish());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.records.size(), 2u);
  EXPECT_TRUE(r.RecordStatus(0).ok()) << r.RecordStatus(0).ToString();
  EXPECT_EQ(r.RecordStatus(1).code(), Code::kProtocol);
  // The first Hello's session is live (unattached): a second client is refused, clearly.
  auto second = c.Call(broker.value(), hello);
  EXPECT_EQ(second.status().code(), Code::kOverload) << second.status().ToString();
}

TEST(Tandemd, MalformedBatchesGetClearErrors) {
  Daemon d({});
  ASSERT_FALSE(d.address().empty());
  TestClient c;
  auto s = OpenSession(c, d.address());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::DeviceSyncReq{0}, 7);
  const std::vector<uint8_t> good = w.Finish();
  std::vector<uint8_t> bad_magic = good;
  bad_magic[0] ^= 0x55;
  std::vector<uint8_t> trailing = good;
  trailing.push_back(1);
  w.AddRaw(0x0F0F, 0, 8, {});
  const std::vector<uint8_t> unknown = w.Finish();
  w.AddRaw(static_cast<uint16_t>(ir::Opcode::kDeviceSync), 0, 9, std::vector<uint8_t>(12, 0));
  const std::vector<uint8_t> long_record = w.Finish();
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    Code code;
    const char* message;
  } cases[] = {
      {"garbage", {0x13, 0x37, 0xc0, 0xde, 0x00}, Code::kProtocol, "shorter than its header"},
      {"truncated", std::vector<uint8_t>(good.begin(), good.end() - 4), Code::kProtocol, "does not match"},
      {"wrong magic", bad_magic, Code::kProtocol, "bad magic"},
      {"unknown opcode", unknown, Code::kUnimplemented, "0x0f0f"},
      {"trailing bytes", trailing, Code::kProtocol, "does not match"},
      {"trailing bytes in a record", long_record, Code::kProtocol, "trailing bytes in DeviceSync"},
  };
  for (fabric::PeerId peer : {s->worker, s->broker}) {
    for (const Case& k : cases) {
      ReplyBatch r = c.Exchange(peer, k.bytes);
      ASSERT_TRUE(r.status.ok()) << k.what << ": " << r.status.ToString();
      ASSERT_EQ(r.records.size(), 1u) << k.what;
      Status st = r.RecordStatus(0);
      // Records that parse reach the broker's own check: it answers only Hello and ServerStatus.
      if (peer == s->broker && (k.code == Code::kUnimplemented || k.bytes == long_record)) {
        EXPECT_EQ(st.code(), Code::kProtocol) << k.what;
        EXPECT_NE(st.message().find("only Hello and ServerStatus"), std::string::npos) << st.message();
        continue;
      }
      EXPECT_EQ(st.code(), k.code) << k.what << ": " << st.ToString();
      EXPECT_NE(st.message().find(k.message), std::string::npos) << k.what << ": " << st.message();
    }
  }
  // The broker refuses session commands; the worker refuses broker commands.
  auto on_broker = c.Call(s->broker, ir::DeviceSyncReq{0});
  EXPECT_EQ(on_broker.status().code(), Code::kProtocol);
  auto on_worker = c.Call(s->worker, ir::ServerStatusReq{});
  EXPECT_EQ(on_worker.status().code(), Code::kProtocol);
  // And the session still serves.
  RoundTrip(c, s->worker, 0x300, 1u << 16);
}

TEST(Tandemd, BadRangesAndForeignHandlesAreRefused) {
  Daemon d({});
  ASSERT_FALSE(d.address().empty());
  TestClient a, b;
  auto sa = OpenSession(a, d.address());
  ASSERT_TRUE(sa.ok()) << sa.status().ToString();
  auto sb = OpenSession(b, d.address());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_NE(sa->hello.session_port, sb->hello.session_port);

  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{0x10, 0, 4096, 0, 0}, 1);
  w.AddRequest(ir::DeviceSyncReq{0}, 2);
  ASSERT_TRUE(TestClient::Decode<ir::DeviceSyncReq>(a.Exchange(sa->worker, w.Finish())).status().ok());

  // Session B cannot see A's buffer 0x10, and its own copies must stay in range.
  auto foreign = b.Call(sb->worker, ir::BufferCopyReq{0, 0x10, 0, 0x10, 64, 64, {}, 0}, ir::kRecordWantReply);
  EXPECT_EQ(foreign.status().code(), Code::kUnknownHandle) << foreign.status().ToString();
  w.AddRequest(ir::BufferAllocReq{0x20, 0, 1024, 0, 0}, 3);
  w.AddRequest(ir::BufferCopyReq{0, 0x20, 1000, 0x20, 0, 100, {}, 0}, 4);  // async: deferred
  w.AddRequest(ir::BufferCopyReq{0, 0x20, 0, 0x20, ~0ull - 10, 100, {}, 0}, 5, ir::kRecordWantReply);
  w.AddRequest(ir::DeviceSyncReq{0}, 6);
  std::vector<ReplyBatch> replies = b.ExchangeAll(sb->worker, w.Finish(), 2);
  std::vector<std::pair<const ReplyBatch*, size_t>> records;  // in arrival order
  for (const ReplyBatch& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    for (size_t i = 0; i < r.records.size(); ++i) records.emplace_back(&r, i);
  }
  ASSERT_EQ(records.size(), 2u);
  ir::ReplyHead head;
  EXPECT_EQ(records[0].first->records[records[0].second].header.seq, 5u);
  EXPECT_EQ(records[0].first->RecordStatus(records[0].second, &head).code(), Code::kInvalidArgument);
  ASSERT_EQ(head.deferred.size(), 1u);
  EXPECT_EQ(head.deferred[0].seq, 4u);
  EXPECT_EQ(head.deferred[0].code, static_cast<uint32_t>(Code::kInvalidArgument));
  EXPECT_EQ(records[1].first->records[records[1].second].header.seq, 6u);
  EXPECT_TRUE(records[1].first->RecordStatus(records[1].second).ok());

  // Nor can B attach to A's session, even with A's key.
  auto wa = b.Connect(fmt::format("127.0.0.1:{}", sa->hello.session_port));
  ASSERT_TRUE(wa.ok());
  auto attach = b.Call(wa.value(), ir::AttachReq{sa->hello.session_key});
  EXPECT_EQ(attach.status().code(), Code::kAuth) << attach.status().ToString();

  // After all that, both sessions still compute the right answers.
  RoundTrip(a, sa->worker, 0x400, 1u << 20);
  RoundTrip(b, sb->worker, 0x500, 1u << 20);
}

}  // namespace

// Run in a child process (see main): opens a session, starts a 128 MiB RMA write and dies
// in the middle of it.
int VanishingClient(const std::string& server) {
  TestClient c;
  auto s = OpenSession(c, server);
  if (!s.ok()) return 2;
  constexpr size_t kSize = 128u << 20;
  std::vector<uint8_t> host(kSize, 0x5a);
  auto mr = c.ep().Register(host.data(), host.size(), fabric::kRemoteRead);
  if (!mr.ok()) return 3;
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, kSize, 0, 0}, 1);
  ir::BufferWriteReq wr;
  wr.buffer = 1;
  wr.size = kSize;
  wr.remote = RegionOf(*mr.value());
  w.AddRequest(wr, 2, ir::kRecordWantReply);
  if (!c.ep().Send(s->worker, w.Finish()).ok()) return 4;
  std::this_thread::sleep_for(30ms);
  ::raise(SIGKILL);
  return 5;
}

namespace {

TEST(Tandemd, ClientVanishingMidTransferFreesItsSession) {
  Daemon d({"--session-timeout-ms", "1500"});
  ASSERT_FALSE(d.address().empty());
  pid_t child = ::fork();
  if (child == 0) {
    const char* argv[] = {"/proc/self/exe", "--vanishing-client", d.address().c_str(), nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the vanishing client exited with " << WEXITSTATUS(status);

  TestClient c;
  auto broker = c.Connect(d.address());
  ASSERT_TRUE(broker.ok());
  // Its worker ends within the session timeout, which frees everything it held.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  uint32_t live = LiveSessions(c, broker.value());
  while (live != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    live = LiveSessions(c, broker.value());
  }
  EXPECT_EQ(live, 0u) << d.Log();
  // The server goes on serving new clients.
  auto s = OpenSession(c, d.address());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RoundTrip(c, s->worker, 0x600, 4u << 20);
}

// A resumable session (Attach with the flag ir::kRecordResumable): each reply batch ends with
// an Ack, a resent request is dropped, and a client whose connection broke resumes on a new
// one and gets the replies it missed.
ir::AckReq AckOf(const ReplyBatch& b) {
  ir::AckReq ack{};
  EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  if (!b.status.ok() || b.records.empty()) return ack;
  const ir::Record& last = b.records.back();
  EXPECT_EQ(last.header.opcode, static_cast<uint16_t>(ir::Opcode::kAck));
  EXPECT_EQ(last.header.seq, 0u);
  EXPECT_TRUE(ir::DecodeRequest(last.payload, &ack).ok());
  return ack;
}

std::vector<uint8_t> PingBatch(uint64_t seq) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::PingReq{seq * 11}, seq);
  return w.Finish();
}

TEST(Tandemd, ResumableSessionDropsDuplicatesAndResumes) {
  Daemon d({});
  ASSERT_FALSE(d.address().empty());
  TestClient c;
  auto broker = c.Connect(d.address());
  ASSERT_TRUE(broker.ok());
  auto hello = c.Call(broker.value(), ir::HelloReq{ir::kMagic, ir::kProtocolVersion, ir::kFeatureRma | ir::kFeatureOpenCL,
                                                   "", "resume-test"});
  ASSERT_TRUE(hello.status().ok()) << hello.status().ToString();
  const std::string worker_addr = fmt::format("127.0.0.1:{}", hello.rep.session_port);
  auto worker = c.Connect(worker_addr);
  ASSERT_TRUE(worker.ok());
  ir::BatchWriter attach(ir::BatchKind::kRequests);
  attach.AddRequest(ir::AttachReq{hello.rep.session_key}, 1, ir::kRecordResumable);
  auto a = TestClient::Decode<ir::AttachReq>(c.Exchange(worker.value(), attach.Finish()));
  ASSERT_TRUE(a.status().ok()) << a.status().ToString();

  // Seq 1, then the same batch again (a resend), then seq 2: the resend is dropped.
  ReplyBatch first = c.Exchange(worker.value(), PingBatch(1));
  ASSERT_EQ(first.records.size(), 2u);
  EXPECT_EQ(first.records[0].header.seq, 1u);
  EXPECT_EQ(AckOf(first).executed, 1u);
  EXPECT_EQ(AckOf(first).reply_no, 1u);
  ASSERT_TRUE(c.ep().Send(worker.value(), PingBatch(1)).ok());
  ReplyBatch second = c.Exchange(worker.value(), PingBatch(2));
  ASSERT_EQ(second.records.size(), 2u);
  EXPECT_EQ(second.records[0].header.seq, 2u) << "the resent seq 1 was run again";
  EXPECT_EQ(AckOf(second).executed, 2u);
  EXPECT_EQ(AckOf(second).reply_no, 2u);

  // A Resume with the wrong key is refused.
  TestClient other;
  auto intruder = other.Connect(worker_addr);
  ASSERT_TRUE(intruder.ok());
  auto refused = other.Call(intruder.value(), ir::ResumeReq{hello.rep.session_key + 1, 0});
  EXPECT_EQ(refused.status().code(), Code::kAuth) << refused.status().ToString();

  // The link drops; the client resumes having seen only the first reply batch.
  c.ep().Close(worker.value());
  std::this_thread::sleep_for(200ms);
  auto again = c.Connect(worker_addr);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto resumed = c.Call(again.value(), ir::ResumeReq{hello.rep.session_key, 1});
  ASSERT_TRUE(resumed.status().ok()) << resumed.status().ToString() << "\n" << d.Log();
  EXPECT_EQ(resumed.rep.executed, 2u);
  EXPECT_EQ(resumed.rep.sent, 2u);
  ReplyBatch missed = c.Receive(again.value());
  ASSERT_EQ(missed.records.size(), 2u);
  EXPECT_EQ(missed.records[0].header.seq, 2u);
  EXPECT_EQ(AckOf(missed).reply_no, 2u);
  // The session goes on over the new connection.
  ReplyBatch third = c.Exchange(again.value(), PingBatch(3));
  ASSERT_EQ(third.records.size(), 2u);
  EXPECT_EQ(third.records[0].header.seq, 3u);
  EXPECT_EQ(AckOf(third).reply_no, 3u);
  EXPECT_EQ(LiveSessions(c, broker.value()), 1u);
}

// A batch runs on the thread that received it when nothing else runs (the worker's
// Executor). One that runs long must not hold up what only the receiving thread does: the
// other thread takes over receiving. Here a 128 MiB RMA write keeps a batch busy for tens of
// milliseconds while a ping, sent just after it, is answered first.
TEST(Tandemd, APingIsAnsweredWhileALongBatchRunsWhereItWasReceived) {
  Daemon d({});
  ASSERT_FALSE(d.address().empty());
  TestClient c;
  auto s = OpenSession(c, d.address());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  constexpr size_t kSize = 128u << 20;
  std::vector<uint8_t> host(kSize, 0x5a);
  auto mr = c.ep().Register(host.data(), host.size(), fabric::kRemoteRead);
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  // The session is idle: the write's batch runs on the thread that receives it.
  ASSERT_TRUE(c.Exchange(s->worker, PingBatch(c.next_seq())).status.ok());
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, kSize, 0, 0}, c.next_seq());
  ir::BufferWriteReq wr;
  wr.buffer = 1;
  wr.size = kSize;
  wr.remote = RegionOf(*mr.value());
  const uint64_t write_seq = c.next_seq();
  w.AddRequest(wr, write_seq, ir::kRecordWantReply);
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.ep().Send(s->worker, w.Finish()).ok());
  const uint64_t ping_seq = c.next_seq();
  ASSERT_TRUE(c.ep().Send(s->worker, PingBatch(ping_seq)).ok());
  ReplyBatch first = c.Receive(s->worker);
  const auto ping_after = std::chrono::steady_clock::now() - sent;
  ReplyBatch second = c.Receive(s->worker);
  const auto write_after = std::chrono::steady_clock::now() - sent;
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  ASSERT_EQ(first.records.size(), 1u);
  ASSERT_EQ(second.records.size(), 1u);
  EXPECT_EQ(first.records[0].header.seq, ping_seq)
      << "the ping waited for the write: answered after "
      << std::chrono::duration_cast<std::chrono::microseconds>(ping_after).count() << " us, the write after "
      << std::chrono::duration_cast<std::chrono::microseconds>(write_after).count() << " us";
  EXPECT_EQ(second.records[0].header.seq, write_seq);
  EXPECT_TRUE(second.RecordStatus(0).ok()) << second.RecordStatus(0).ToString();
}

}  // namespace
}  // namespace tandem::test

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--vanishing-client") return tandem::test::VanishingClient(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
