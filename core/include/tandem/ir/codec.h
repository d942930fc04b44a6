// Fixed little-endian encoding of the IR (STYLE.md point 5). Integers are written with
// explicit byte order; strings, byte arrays and lists carry a u32 count checked against
// the limits in ir.h before anything is allocated.
//
// A fabric message is a batch:  BatchHeader, then `count` records of RecordHeader+payload.
// A request record's payload is the request's fields. A reply record's payload is
// ReplyStatus, the deferred async errors, then (if the status is OK) the reply's fields.
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tandem/ir/ir.h"
#include "tandem/status.h"

namespace tandem::ir {

// Stores v at p in little-endian byte order (sizeof(T) bytes).
template <class T>
void StoreLE(uint8_t* p, T v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  const U u = static_cast<U>(v);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}
// Reads a T stored at p in little-endian byte order (sizeof(T) bytes).
template <class T>
T LoadLE(const uint8_t* p) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<U>(p[i]) << (8 * i);
  return static_cast<T>(u);
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <class T>
  void PutInt(T v) {
    // Bytes made here, then one insert: a push_back per byte cost a capacity check each, and
    // encoding showed in a launch's profile (2026-11-27-f).
    uint8_t b[sizeof(T)];
    StoreLE(b, v);
    out_->insert(out_->end(), b, b + sizeof(T));
  }
  void PutRaw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  size_t size() const { return out_->size(); }
  std::vector<uint8_t>* buffer() { return out_; }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  explicit Reader(std::span<const uint8_t> s) : Reader(s.data(), s.size()) {}
  template <class T>
  bool GetInt(T* v) {
    if (remaining() < sizeof(T)) return Fail("truncated integer");
    *v = LoadLE<T>(p_);
    p_ += sizeof(T);
    return true;
  }
  bool GetRaw(void* dst, size_t n) {
    if (remaining() < n) return Fail("truncated data");
    std::memcpy(dst, p_, n);
    p_ += n;
    return true;
  }
  // Reads a u32 count and checks it against a limit and against the bytes left
  // (each element needs at least min_elem bytes), so a hostile count cannot allocate.
  bool GetCount(uint32_t* n, uint32_t limit, size_t min_elem) {
    if (!GetInt(n)) return false;
    if (*n > limit) return Fail("count over limit");
    if (min_elem && static_cast<uint64_t>(*n) * min_elem > remaining()) return Fail("count exceeds message");
    return true;
  }
  bool Fail(const char* why) {
    if (!error_) error_ = why;
    p_ = end_;
    return false;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  const uint8_t* cursor() const { return p_; }
  void Skip(size_t n) { p_ += std::min(n, remaining()); }
  bool ok() const { return error_ == nullptr; }
  const char* error() const { return error_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const char* error_ = nullptr;
};

// ---- encoding of each field type ------------------------------------------------------
template <class T>
  requires std::is_integral_v<T>
void Put(Writer& w, const T& v) { w.PutInt(v); }
inline void Put(Writer& w, const f64& v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  w.PutInt(u);
}
inline void Put(Writer& w, const str& s) {
  w.PutInt(static_cast<uint32_t>(s.size()));
  w.PutRaw(s.data(), s.size());
}
inline void Put(Writer& w, const bytes& b) {
  w.PutInt(static_cast<uint32_t>(b.size()));
  w.PutRaw(b.data(), b.size());
}
template <class T>
  requires requires(const T& t, Writer& w) { VisitFields(t, w); }
void Put(Writer& w, const T& s);
template <class T>
void Put(Writer& w, const std::vector<T>& v) {
  w.PutInt(static_cast<uint32_t>(v.size()));
  for (const auto& e : v) Put(w, e);
}
struct PutVisitor {
  Writer& w;
  template <class T>
  void operator()(const T& f, const char*) { Put(w, f); }
};
template <class T>
  requires requires(const T& t, Writer& w) { VisitFields(t, w); }
void Put(Writer& w, const T& s) {
  PutVisitor v{w};
  VisitFields(s, v);
}

// A request's (or any field struct's) encoding on its own: a payload for PostRaw / CallRaw.
inline constexpr size_t kEncodeReserve = 256;
template <class T>
std::vector<uint8_t> Encode(const T& fields) {
  std::vector<uint8_t> out;
  out.reserve(kEncodeReserve);  // most requests fit: no growing from empty, byte by byte
  Writer w(&out);
  Put(w, fields);
  return out;
}

template <class T>
  requires std::is_integral_v<T>
bool Get(Reader& r, T* v) { return r.GetInt(v); }
inline bool Get(Reader& r, f64* v) {
  uint64_t u;
  if (!r.GetInt(&u)) return false;
  std::memcpy(v, &u, 8);
  return true;
}
inline bool Get(Reader& r, str* s) {
  uint32_t n;
  if (!r.GetCount(&n, kMaxString, 1)) return false;
  s->assign(reinterpret_cast<const char*>(r.cursor()), n);
  r.Skip(n);
  return true;
}
inline bool Get(Reader& r, bytes* b) {
  uint32_t n;
  if (!r.GetCount(&n, kMaxBytes, 1)) return false;
  b->assign(r.cursor(), r.cursor() + n);
  r.Skip(n);
  return true;
}
template <class T>
  requires requires(T& t, Reader& r) { VisitFields(t, r); }
bool Get(Reader& r, T* s);
template <class T>
bool Get(Reader& r, std::vector<T>* v) {
  uint32_t n;
  // Every element encodes to at least one byte (structs: at least 4), bounding n by the data left.
  if (!r.GetCount(&n, kMaxListItems, std::is_integral_v<T> ? sizeof(T) : 1)) return false;
  // Not cleared first: every element is overwritten, so one decoded into again (a reused
  // request, Session::Run) keeps its elements' own capacity.
  v->resize(n);
  for (auto& e : *v)
    if (!Get(r, &e)) return false;
  return true;
}
struct GetVisitor {
  Reader& r;
  template <class T>
  void operator()(T& f, const char*) {
    if (r.ok()) Get(r, &f);
  }
};
template <class T>
  requires requires(T& t, Reader& r) { VisitFields(t, r); }
bool Get(Reader& r, T* s) {
  GetVisitor v{r};
  VisitFields(*s, v);
  return r.ok();
}

// ---- framing ----------------------------------------------------------------------------
enum class BatchKind : uint16_t { kRequests = 1, kReplies = 2 };
inline constexpr size_t kBatchHeaderSize = 16;
inline constexpr size_t kRecordHeaderSize = 16;
// Record flags.
inline constexpr uint16_t kRecordWantReply = 1;  // reply even if the command is async
// The Attach that opens a session: the client can Resume it after a link loss (Resume/Ack).
inline constexpr uint16_t kRecordResumable = 2;
// A hint: the program's only posting thread waits for this record's reply, and the client
// runs no thread that calls the program back, so nothing of the program's should need this
// session until the reply. The server may then wait for the device on its executor, where it
// would otherwise hand the wait to another thread (Session::Run). Not a promise: keepalive,
// the goodbye at exit and a second thread's very first command can still come meanwhile, and
// wait behind it. A wrong hint costs only that session's latency (one process per session).
inline constexpr uint16_t kRecordCallerWaits = 4;

struct BatchHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  BatchKind kind = BatchKind::kRequests;
  uint32_t count = 0;
  uint32_t bytes = 0;  // payload bytes after this header
};

struct RecordHeader {
  uint16_t opcode = 0;
  uint16_t flags = 0;
  uint32_t length = 0;  // payload bytes after this header
  uint64_t seq = 0;     // request id; a reply carries its request's
};

// Builds one fabric message out of records.
class BatchWriter {
 public:
  explicit BatchWriter(BatchKind kind);
  template <class T>
  void AddRequest(const T& req, uint64_t seq, uint16_t flags = 0) {
    size_t at = BeginRecord(static_cast<uint16_t>(T::kOpcode), flags, seq);
    Writer w(&buf_);
    Put(w, req);
    EndRecord(at);
  }
  // A reply: status, deferred errors, then the fields when ok.
  template <class Rep>
  void AddReply(uint16_t opcode, uint64_t seq, const Status& st, const std::vector<AsyncError>& deferred,
                const Rep* rep) {
    size_t at = BeginRecord(opcode, 0, seq);
    PutStatus(st, deferred);
    if (st.ok() && rep) {
      Writer w(&buf_);
      Put(w, *rep);
    }
    EndRecord(at);
  }
  void AddRaw(uint16_t opcode, uint16_t flags, uint64_t seq, std::span<const uint8_t> payload);
  // A request whose LAST field is `bytes`, left empty in `req`, with room for n bytes there:
  // returns where they go, for the caller to fill in place (valid until the next Add or
  // Finish). Spares a copy of bulk data.
  template <class T>
  uint8_t* AddRequestWithTail(const T& req, size_t n, uint64_t seq, uint16_t flags = 0) {
    size_t at = BeginRecord(static_cast<uint16_t>(T::kOpcode), flags, seq);
    Writer w(&buf_);
    Put(w, req);
    StoreLE(buf_.data() + buf_.size() - 4, static_cast<uint32_t>(n));  // the empty tail's u32 count
    const size_t data_at = buf_.size();
    buf_.resize(data_at + n);
    EndRecord(at);
    return buf_.data() + data_at;
  }
  uint32_t count() const { return count_; }
  size_t size() const { return buf_.size(); }
  bool empty() const { return count_ == 0; }
  // Finishes the header and hands the message out; the writer is then empty again. A writer
  // that lives on (the client's batch) passes keep_room: the next batch starts with room like
  // this one's (up to 64 KiB) instead of growing from empty; one used once must not pay for it.
  std::vector<uint8_t> Finish(bool keep_room = false);

 private:
  size_t BeginRecord(uint16_t opcode, uint16_t flags, uint64_t seq);
  void EndRecord(size_t at);
  void PutStatus(const Status& st, const std::vector<AsyncError>& deferred);
  BatchKind kind_;
  uint32_t count_ = 0;
  std::vector<uint8_t> buf_;
};

struct Record {
  RecordHeader header;
  std::span<const uint8_t> payload;
};

// Splits a message into records; every length is checked against the message.
Status ParseBatch(std::span<const uint8_t> msg, BatchKind expected, std::vector<Record>* out);

// Decodes a request's fields; trailing bytes are an error (a wrong-version peer).
template <class T>
Status DecodeRequest(std::span<const uint8_t> payload, T* req) {
  Reader r(payload);
  if (!Get(r, req)) return Status::Protocol(std::string("malformed ") + std::string(T::kName) + ": " + r.error());
  if (r.remaining() != 0) return Status::Protocol(std::string("trailing bytes in ") + std::string(T::kName));
  return Status::Ok();
}

// Decodes a reply: returns the status carried in it; fills rep when it is ok.
struct ReplyHead {
  Status status;
  std::vector<AsyncError> deferred;
};
Status DecodeReplyHead(Reader& r, ReplyHead* head);
template <class Rep>
Status DecodeReply(std::span<const uint8_t> payload, ReplyHead* head, Rep* rep) {
  Reader r(payload);
  TANDEM_RETURN_IF_ERROR(DecodeReplyHead(r, head));
  if (!head->status.ok()) return Status::Ok();
  if (!Get(r, rep)) return Status::Protocol(std::string("malformed reply: ") + r.error());
  if (r.remaining() != 0) return Status::Protocol("trailing bytes in reply");
  return Status::Ok();
}

// Human-readable one-line rendering of a record for TANDEM_TRACE=1.
std::string TraceRequest(uint16_t opcode, std::span<const uint8_t> payload);
template <class T>
std::string TraceFields(const T& s);

}  // namespace tandem::ir
