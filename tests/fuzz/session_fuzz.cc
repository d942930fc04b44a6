// Feeds arbitrary bytes through exactly the code a session worker runs on a client's
// messages: Session::RunUrgent (the receive thread) and Session::HandleBatch (batch
// parsing, the generated dispatch table, request decoding, the backend, deferred errors),
// over the in-memory backend. Every reply the session produces must itself parse.
#include "session_fuzz.h"

#include <cstdlib>
#include <cstring>

#include "memory_backend.h"
#include "tandem/server/session.h"

namespace tandem::test {
namespace {

constexpr uint64_t kKey = 0x5eed;

std::vector<uint8_t> AttachBatch() {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::AttachReq{kKey}, 1);
  return w.Finish();
}

void CheckReply(const std::vector<uint8_t>& reply) {
  if (reply.empty()) return;
  std::vector<ir::Record> records;
  if (!ir::ParseBatch(reply, ir::BatchKind::kReplies, &records).ok()) std::abort();
}

void RunMessage(server::Session& session, std::span<const uint8_t> msg) {
  if (auto pong = session.RunUrgent(msg)) CheckReply(*pong);
  server::BatchOutcome out = session.HandleBatch(msg);
  CheckReply(out.reply);
}

}  // namespace

// Seeds: well-formed batches of the commands the memory backend serves, plus the
// malformed shapes the server must answer (garbage, bad magic, truncation, unknown opcode).
std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  auto frame = [](uint8_t mode, const std::vector<std::vector<uint8_t>>& msgs) {
    std::vector<uint8_t> in{mode};
    for (const auto& m : msgs) {
      const uint32_t n = static_cast<uint32_t>(m.size());
      for (int i = 0; i < 4; ++i) in.push_back(static_cast<uint8_t>(n >> (8 * i)));
      in.insert(in.end(), m.begin(), m.end());
    }
    return in;
  };
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(ir::BufferAllocReq{1, 0, 256, 0, 0}, 1);
  w.AddRequest(ir::BufferWriteReq{0, 1, 0, 4, {1, 2, 3, 4}, {}, {}, 7}, 2);
  w.AddRequest(ir::BufferFillReq{0, 1, 8, 8, {9, 9}, {7}, 0}, 3);
  w.AddRequest(ir::BufferCopyReq{0, 1, 0, 1, 128, 16, {}, 0}, 4);
  w.AddRequest(ir::BufferReadReq{0, 1, 0, 256, {}, {7}, 0}, 5);
  std::vector<uint8_t> good = w.Finish();
  w.AddRequest(ir::BufferCopyReq{0, 1, 250, 1, 0, 16, {}, 9}, 6);  // out of range: fails signal 9
  w.AddRequest(ir::EventQueryReq{9}, 7);
  w.AddRequest(ir::EventWaitReq{{9, 7}}, 8);
  w.AddRequest(ir::DeviceSyncReq{0}, 9);
  std::vector<uint8_t> failing = w.Finish();
  w.AddRequest(ir::PingReq{42}, 10);
  std::vector<uint8_t> ping = w.Finish();
  w.AddRequest(ir::HelloReq{ir::kMagic, ir::kProtocolVersion, 0, "t", "c"}, 11);
  w.AddRaw(0x7777, 0, 12, {});
  w.AddRequest(ir::GoodbyeReq{}, 13);
  std::vector<uint8_t> odd = w.Finish();
  std::vector<uint8_t> bad_magic = good;
  bad_magic[0] ^= 0xff;
  std::vector<uint8_t> truncated(good.begin(), good.begin() + static_cast<ptrdiff_t>(good.size() / 2));
  std::vector<uint8_t> garbage = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3};
  return {frame(0, {good, failing, ping}), frame(0, {odd}), frame(0, {bad_magic, truncated, garbage, good}),
          frame(1, {good}), frame(1, {AttachBatch(), good})};
}

}  // namespace tandem::test

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  if (size == 0) return 0;
  test::MemoryBackend backend;
  server::Session session(&backend, test::kKey);
  if ((data[0] & 1) == 0) test::RunMessage(session, test::AttachBatch());
  size_t at = 1;
  while (at < size) {
    uint32_t n = 0;
    if (size - at >= 4) {
      for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(data[at + i]) << (8 * i);
    }
    if (size - at < 4 || n > size - at - 4) {
      test::RunMessage(session, std::span<const uint8_t>(data + at, size - at));  // the rest, as one message
      break;
    }
    test::RunMessage(session, std::span<const uint8_t>(data + at + 4, n));
    at += 4 + n;
  }
  return 0;
}
