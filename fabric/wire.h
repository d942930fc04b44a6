// The fabric's own wire header: every fabric message starts with it, so a receiver knows the
// sender (by connection id) without FI_SOURCE and can reassemble fragments. Little-endian,
// fixed 48 bytes, pinned by a static_assert and a test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::fabric::wire {

constexpr uint32_t kMagic = 0x42414654;  // "TFAB"
constexpr uint8_t kVersion = 1;
// Reassembly refuses messages larger than this (a bad header must not allocate unbounded memory).
constexpr uint64_t kMaxMessage = uint64_t{1} << 34;

// Explicit, never reused.
enum class Type : uint8_t { kConnect = 1, kConnectAck = 2, kData = 3, kBye = 4 };

struct Header {
  Type type = Type::kData;
  uint64_t conn_id = 0;
  uint64_t msg_id = 0;
  uint32_t frag_index = 0;
  uint32_t frag_count = 1;
  uint64_t total_len = 0;  // whole message
  uint64_t offset = 0;     // of this fragment's payload inside the whole message
};
constexpr size_t kHeaderSize = 48;

void EncodeHeader(const Header& h, uint8_t* out);
// Nullopt on short input, wrong magic or version, unknown type, or inconsistent fragment fields
// (`len` counts the header and the payload after it).
std::optional<Header> DecodeHeader(const uint8_t* in, size_t len);

// CONNECT payload: who is connecting and with what, so the listener can reach it back and
// refuse an incompatible stack (tcp;ofi_rxm of 1.17 and tcp of 1.18 do not interoperate).
struct Connect {
  uint32_t fi_version = 0;  // fi_version() of the connector
  std::string provider;     // exact provider stack, e.g. "tcp;ofi_rxm"
  std::vector<uint8_t> address;  // raw fi_getname() of the connector
};
std::vector<uint8_t> EncodeConnect(const Connect& c);
std::optional<Connect> DecodeConnect(const uint8_t* in, size_t len);

// CONNECT_ACK payload: zero for accepted, else a reason the connector reports as kProtocol.
struct ConnectAck {
  uint32_t refused = 0;
  std::string reason;
};
std::vector<uint8_t> EncodeConnectAck(const ConnectAck& a);
std::optional<ConnectAck> DecodeConnectAck(const uint8_t* in, size_t len);

}  // namespace tandem::fabric::wire
