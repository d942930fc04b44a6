// Feeds arbitrary frames through what the fabric does with a peer's bytes before anything
// else sees them: the 48-byte header's decoding (wire::DecodeHeader), the CONNECT and
// CONNECT_ACK payloads, and one peer's reassembly (fabric::Reassembly, small limits). The
// input is a sequence of frames, each a 2-byte little-endian length and that many bytes; a
// frame whose header decodes as data goes to the reassembly, as rdm_messages.cc hands it.
// Checked on every frame: what the reassembly holds stays inside its limits, messages come
// out whole (each as long as its header said) and in msg_id order, and after an error (the
// link would end) nothing more is taken.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "reassembly.h"
#include "session_fuzz.h"
#include "wire.h"

namespace tandem::test {
namespace {

namespace wire = fabric::wire;

constexpr fabric::Reassembly::Limits kLimits{.max_open = 8, .max_ahead = 64, .max_held = 1u << 16};

void Check(bool ok) {
  if (!ok) std::abort();
}

// A frame of the input: its u16 length, the header, the payload.
std::vector<uint8_t> Frame(const wire::Header& h, std::span<const uint8_t> payload) {
  const size_t len = wire::kHeaderSize + payload.size();
  std::vector<uint8_t> out(2 + len);
  out[0] = static_cast<uint8_t>(len & 0xff);
  out[1] = static_cast<uint8_t>(len >> 8);
  wire::EncodeHeader(h, out.data() + 2);
  if (!payload.empty()) std::memcpy(out.data() + 2 + wire::kHeaderSize, payload.data(), payload.size());
  return out;
}

wire::Header Data(uint64_t msg, uint32_t index, uint32_t count, uint64_t total, uint64_t offset) {
  return wire::Header{.type = wire::Type::kData, .conn_id = 7, .msg_id = msg, .frag_index = index,
                      .frag_count = count, .total_len = total, .offset = offset};
}

}  // namespace

std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  const std::vector<uint8_t> ten(10, 0x5a), five(5, 0xa5);
  std::vector<std::vector<uint8_t>> seeds;
  auto seq = [](std::initializer_list<std::vector<uint8_t>> frames) {
    std::vector<uint8_t> s;
    for (const auto& f : frames) s.insert(s.end(), f.begin(), f.end());
    return s;
  };
  // Whole messages in order; fragments out of order; a message ahead of its predecessor.
  seeds.push_back(seq({Frame(Data(0, 0, 1, 10, 0), ten), Frame(Data(1, 0, 1, 5, 0), five)}));
  seeds.push_back(seq({Frame(Data(0, 1, 2, 15, 10), five), Frame(Data(0, 0, 2, 15, 0), ten)}));
  seeds.push_back(seq({Frame(Data(1, 0, 1, 5, 0), five), Frame(Data(0, 0, 1, 10, 0), ten)}));
  // Rule breakers: an overlap, a repeat, a short single fragment, a claim far ahead, a huge total.
  seeds.push_back(seq({Frame(Data(0, 0, 2, 15, 0), ten), Frame(Data(0, 1, 2, 15, 5), ten)}));
  seeds.push_back(seq({Frame(Data(0, 0, 2, 15, 0), ten), Frame(Data(0, 0, 2, 15, 0), ten)}));
  seeds.push_back(seq({Frame(Data(0, 0, 1, 20, 0), ten)}));
  seeds.push_back(seq({Frame(Data(1000, 0, 2, 15, 0), ten)}));
  seeds.push_back(seq({Frame(Data(0, 0, 3, uint64_t{1} << 33, 0), ten)}));
  // Control frames: a CONNECT with its payload, a CONNECT_ACK refusal, a BYE; then garbage.
  wire::Header c{.type = wire::Type::kConnect, .conn_id = 9};
  std::vector<uint8_t> connect = wire::EncodeConnect({0x10011, "net", {1, 2, 3, 4}});
  c.total_len = connect.size();
  std::vector<uint8_t> ack_payload = wire::EncodeConnectAck({1, "provider tcp;ofi_rxm here is net"});
  wire::Header a{.type = wire::Type::kConnectAck, .conn_id = 9, .total_len = ack_payload.size()};
  seeds.push_back(seq({Frame(c, connect), Frame(a, ack_payload), Frame(wire::Header{.type = wire::Type::kBye}, {})}));
  seeds.push_back({0x30, 0x00, 'T', 'F', 'A', 'B', 1, 3, 0, 0});
  return seeds;
}

}  // namespace tandem::test

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  using test::Check;
  using test::kLimits;
  namespace wire = fabric::wire;
  fabric::Reassembly r(kLimits);
  uint64_t next_due = 0;  // the msg_id the next message handed on must have
  std::vector<uint64_t> totals;  // claimed total of each message begun, by msg_id (small ids only)
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t len = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    if (len > size - at) break;
    const uint8_t* frame = data + at;
    at += len;
    auto h = wire::DecodeHeader(frame, len);
    if (!h) continue;  // dropped, as the endpoint drops it
    const uint8_t* payload = frame + wire::kHeaderSize;
    const size_t n = len - wire::kHeaderSize;
    switch (h->type) {
      case wire::Type::kConnect:
        if (auto c = wire::DecodeConnect(payload, n)) Check(wire::DecodeConnect(wire::EncodeConnect(*c).data(),
                                                                               wire::EncodeConnect(*c).size()).has_value());
        continue;
      case wire::Type::kConnectAck:
        if (auto c = wire::DecodeConnectAck(payload, n)) {
          std::vector<uint8_t> again = wire::EncodeConnectAck(*c);
          auto back = wire::DecodeConnectAck(again.data(), again.size());
          Check(back && back->refused == c->refused && back->reason == c->reason);
        }
        continue;
      case wire::Type::kBye:
        continue;
      case wire::Type::kData:
        break;
    }
    // What DecodeHeader promises the reassembly: the payload lies inside the message.
    Check(h->offset <= h->total_len && n <= h->total_len - h->offset);
    if (h->msg_id < 64) {
      if (totals.size() <= h->msg_id) totals.resize(h->msg_id + 1, UINT64_MAX);
      if (totals[h->msg_id] == UINT64_MAX) totals[h->msg_id] = h->total_len;
    }
    std::vector<std::vector<uint8_t>> out;
    Status st = r.Add(*h, payload, n, &out);
    for (const auto& m : out) {
      // In order, and as long as the first fragment of that message said.
      Check(next_due < totals.size() ? m.size() == totals[next_due] : true);
      ++next_due;
    }
    Check(r.next() == next_due);
    Check(r.open() <= kLimits.max_open);
    Check(r.held() <= kLimits.max_held);
    if (!st.ok()) break;  // the link ends: nothing more from this peer is taken
  }
  return 0;
}
