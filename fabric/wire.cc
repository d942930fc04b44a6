#include "wire.h"

#include <cstring>

namespace tandem::fabric::wire {
namespace {

// Little-endian helpers: the layout is explicit, whatever the host.
template <class T>
void Put(uint8_t*& p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) *p++ = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
template <class T>
T Get(const uint8_t*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(*p++) << (8 * i);
  return static_cast<T>(v);
}

// Reads length-prefixed bytes, refusing to run past `end`.
bool GetBytes(const uint8_t*& p, const uint8_t* end, size_t n, const uint8_t** out) {
  if (static_cast<size_t>(end - p) < n) return false;
  *out = p;
  p += n;
  return true;
}

}  // namespace

void EncodeHeader(const Header& h, uint8_t* out) {
  uint8_t* p = out;
  Put<uint32_t>(p, kMagic);
  Put<uint8_t>(p, kVersion);
  Put<uint8_t>(p, static_cast<uint8_t>(h.type));
  Put<uint16_t>(p, 0);  // reserved
  Put<uint64_t>(p, h.conn_id);
  Put<uint64_t>(p, h.msg_id);
  Put<uint32_t>(p, h.frag_index);
  Put<uint32_t>(p, h.frag_count);
  Put<uint64_t>(p, h.total_len);
  Put<uint64_t>(p, h.offset);
}

std::optional<Header> DecodeHeader(const uint8_t* in, size_t len) {
  if (len < kHeaderSize) return std::nullopt;
  const uint8_t* p = in;
  if (Get<uint32_t>(p) != kMagic || Get<uint8_t>(p) != kVersion) return std::nullopt;
  auto type = Get<uint8_t>(p);
  if (type < static_cast<uint8_t>(Type::kConnect) || type > static_cast<uint8_t>(Type::kBye)) return std::nullopt;
  Get<uint16_t>(p);
  Header h;
  h.type = static_cast<Type>(type);
  h.conn_id = Get<uint64_t>(p);
  h.msg_id = Get<uint64_t>(p);
  h.frag_index = Get<uint32_t>(p);
  h.frag_count = Get<uint32_t>(p);
  h.total_len = Get<uint64_t>(p);
  h.offset = Get<uint64_t>(p);
  // The fragment must lie inside its message, and the message must be of a sane size.
  size_t payload = len - kHeaderSize;
  if (h.frag_count == 0 || h.frag_index >= h.frag_count || h.total_len > kMaxMessage) return std::nullopt;
  if (h.offset > h.total_len || payload > h.total_len - h.offset) return std::nullopt;
  return h;
}

std::vector<uint8_t> EncodeConnect(const Connect& c) {
  std::vector<uint8_t> out(4 + 2 + c.provider.size() + 2 + c.address.size());
  uint8_t* p = out.data();
  Put<uint32_t>(p, c.fi_version);
  Put<uint16_t>(p, c.provider.size());
  std::memcpy(p, c.provider.data(), c.provider.size());
  p += c.provider.size();
  Put<uint16_t>(p, c.address.size());
  std::memcpy(p, c.address.data(), c.address.size());
  return out;
}

std::optional<Connect> DecodeConnect(const uint8_t* in, size_t len) {
  const uint8_t* p = in;
  const uint8_t* end = in + len;
  const uint8_t* bytes = nullptr;
  if (len < 4 + 2) return std::nullopt;
  Connect c;
  c.fi_version = Get<uint32_t>(p);
  size_t n = Get<uint16_t>(p);
  if (!GetBytes(p, end, n, &bytes)) return std::nullopt;
  c.provider.assign(reinterpret_cast<const char*>(bytes), n);
  if (end - p < 2) return std::nullopt;
  n = Get<uint16_t>(p);
  if (n == 0 || !GetBytes(p, end, n, &bytes)) return std::nullopt;
  c.address.assign(bytes, bytes + n);
  return c;
}

std::vector<uint8_t> EncodeConnectAck(const ConnectAck& a) {
  std::vector<uint8_t> out(4 + 2 + a.reason.size());
  uint8_t* p = out.data();
  Put<uint32_t>(p, a.refused);
  Put<uint16_t>(p, a.reason.size());
  std::memcpy(p, a.reason.data(), a.reason.size());
  return out;
}

std::optional<ConnectAck> DecodeConnectAck(const uint8_t* in, size_t len) {
  const uint8_t* p = in;
  const uint8_t* end = in + len;
  const uint8_t* bytes = nullptr;
  if (len < 4 + 2) return std::nullopt;
  ConnectAck a;
  a.refused = Get<uint32_t>(p);
  size_t n = Get<uint16_t>(p);
  if (!GetBytes(p, end, n, &bytes)) return std::nullopt;
  a.reason.assign(reinterpret_cast<const char*>(bytes), n);
  return a;
}

}  // namespace tandem::fabric::wire
