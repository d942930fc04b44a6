#include "tandem/ir/codec.h"

#include <algorithm>

#include <fmt/format.h>

namespace tandem::ir {

const CommandInfo* FindCommand(uint16_t opcode) {
  // The table is small; a linear scan keeps it one source of truth (no second index).
  for (const auto& c : kCommands)
    if (static_cast<uint16_t>(c.opcode) == opcode) return &c;
  return nullptr;
}

std::string_view CommandName(uint16_t opcode) {
  const CommandInfo* c = FindCommand(opcode);
  return c ? c->name : std::string_view("Unknown");
}

BatchWriter::BatchWriter(BatchKind kind) : kind_(kind) {
  buf_.reserve(256);  // a batch of a few records without regrowing
  buf_.resize(kBatchHeaderSize);
}

size_t BatchWriter::BeginRecord(uint16_t opcode, uint16_t flags, uint64_t seq) {
  size_t at = buf_.size();
  Writer w(&buf_);
  w.PutInt(opcode);
  w.PutInt(flags);
  w.PutInt(uint32_t{0});  // length, patched by EndRecord
  w.PutInt(seq);
  return at;
}

void BatchWriter::EndRecord(size_t at) {
  StoreLE(buf_.data() + at + 4, static_cast<uint32_t>(buf_.size() - at - kRecordHeaderSize));
  ++count_;
}

void BatchWriter::AddRaw(uint16_t opcode, uint16_t flags, uint64_t seq, std::span<const uint8_t> payload) {
  size_t at = BeginRecord(opcode, flags, seq);
  buf_.insert(buf_.end(), payload.begin(), payload.end());
  EndRecord(at);
}

void BatchWriter::PutStatus(const Status& st, const std::vector<AsyncError>& deferred) {
  Writer w(&buf_);
  w.PutInt(static_cast<uint32_t>(st.code()));
  w.PutInt(st.native());
  w.PutInt(static_cast<uint32_t>(st.api()));
  Put(w, st.message());
  Put(w, deferred);
}

std::vector<uint8_t> BatchWriter::Finish(bool keep_room) {
  std::vector<uint8_t> out;
  out.swap(buf_);
  // The header in place of the room left for it.
  StoreLE(out.data(), kMagic);
  StoreLE(out.data() + 4, static_cast<uint16_t>(kProtocolVersion));
  StoreLE(out.data() + 6, static_cast<uint16_t>(kind_));
  StoreLE(out.data() + 8, count_);
  StoreLE(out.data() + 12, static_cast<uint32_t>(out.size() - kBatchHeaderSize));
  count_ = 0;
  if (keep_room) buf_.reserve(std::clamp<size_t>(out.size(), 256, 64 * 1024));
  buf_.resize(kBatchHeaderSize);
  return out;
}

Status ParseBatch(std::span<const uint8_t> msg, BatchKind expected, std::vector<Record>* out) {
  out->clear();
  Reader r(msg);
  uint32_t magic, count, bytes;
  uint16_t version, kind;
  if (!r.GetInt(&magic) || !r.GetInt(&version) || !r.GetInt(&kind) || !r.GetInt(&count) || !r.GetInt(&bytes))
    return Status::Protocol("message shorter than its header");
  if (magic != kMagic) return Status::Protocol(fmt::format("bad magic 0x{:08x}", magic));
  if (version != kProtocolVersion)
    return Status::Protocol(fmt::format("protocol version {} (this side speaks {})", version, kProtocolVersion));
  if (kind != static_cast<uint16_t>(expected)) return Status::Protocol(fmt::format("unexpected batch kind {}", kind));
  if (bytes != r.remaining()) return Status::Protocol("batch length does not match the message");
  if (count > r.remaining() / kRecordHeaderSize) return Status::Protocol("record count exceeds message");
  out->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Record rec;
    if (!r.GetInt(&rec.header.opcode) || !r.GetInt(&rec.header.flags) || !r.GetInt(&rec.header.length) ||
        !r.GetInt(&rec.header.seq))
      return Status::Protocol("truncated record header");
    if (rec.header.length > r.remaining()) return Status::Protocol("record longer than message");
    rec.payload = std::span<const uint8_t>(r.cursor(), rec.header.length);
    r.Skip(rec.header.length);
    out->push_back(rec);
  }
  if (r.remaining() != 0) return Status::Protocol("trailing bytes after last record");
  return Status::Ok();
}

Status DecodeReplyHead(Reader& r, ReplyHead* head) {
  uint32_t code, api;
  int32_t native;
  std::string message;
  if (!r.GetInt(&code) || !r.GetInt(&native) || !r.GetInt(&api) || !Get(r, &message) || !Get(r, &head->deferred))
    return Status::Protocol(std::string("malformed reply status: ") + (r.error() ? r.error() : ""));
  if (code > static_cast<uint32_t>(Code::kInternal)) return Status::Protocol("unknown status code in reply");
  head->status = Status(static_cast<Code>(code), std::move(message), native, static_cast<Api>(api));
  return Status::Ok();
}

// ---- trace ------------------------------------------------------------------------------
namespace {
struct TraceVisitor {
  std::string* out;
  bool first = true;
  template <class T>
  void operator()(const T& f, const char* name) {
    if (!first) out->append(" ");
    first = false;
    out->append(name);
    out->push_back('=');
    Render(f);
  }
  template <class T>
    requires std::is_integral_v<T>
  void Render(const T& v) { out->append(fmt::format("{}", v)); }
  void Render(const f64& v) { out->append(fmt::format("{}", v)); }
  void Render(const str& s) {
    out->append(fmt::format("\"{}\"", s.size() > 40 ? s.substr(0, 40) + "..." : s));
  }
  void Render(const bytes& b) { out->append(fmt::format("<{} bytes>", b.size())); }
  template <class T>
  void Render(const std::vector<T>& v) {
    out->push_back('[');
    for (size_t i = 0; i < v.size() && i < 8; ++i) {
      if (i) out->push_back(',');
      Render(v[i]);
    }
    if (v.size() > 8) out->append(fmt::format(",...({})", v.size()));
    out->push_back(']');
  }
  template <class T>
    requires requires(const T& t, TraceVisitor& v) { VisitFields(t, v); }
  void Render(const T& s) {
    out->push_back('{');
    TraceVisitor inner{out};
    VisitFields(s, inner);
    out->push_back('}');
  }
};
}  // namespace

template <class T>
std::string TraceFields(const T& s) {
  std::string out;
  TraceVisitor v{&out};
  VisitFields(s, v);
  return out;
}

std::string TraceRequest(uint16_t opcode, std::span<const uint8_t> payload) {
  std::string out;
  bool found = false;
  ForEachCommand([&]<class Req>() {
    if (found || static_cast<uint16_t>(Req::kOpcode) != opcode) return;
    found = true;
    Req req;
    Status st = DecodeRequest(payload, &req);
    out = fmt::format("{}({})", Req::kName, st.ok() ? TraceFields(req) : "<" + st.message() + ">");
  });
  if (!found) out = fmt::format("Unknown(opcode=0x{:04x}, {} bytes)", opcode, payload.size());
  return out;
}

}  // namespace tandem::ir
