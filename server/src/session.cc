#include "tandem/server/session.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "tandem/log.h"
#include "tandem/server/profile.h"

namespace tandem::server {
namespace {

// Overloads that forward each request type to its generated backend virtual.
#define X(op, Name, flags, req, rep) \
  [[maybe_unused]] Status CallBackend(Backend& b, const ir::Name##Req& r, ir::Name##Rep* p) { return b.On##Name(r, p); }
TANDEM_IR_COMMANDS(X)
#undef X

using Handler = void (Session::*)(const ir::Record&, ir::BatchWriter&);

// The dispatch table, generated from the IR: family (high byte) then index (low byte),
// both bounds-checked before the lookup (STYLE.md point 4).
class DispatchTable {
 public:
  DispatchTable() {
    ir::ForEachCommand([this]<class Req>() {
      const auto op = static_cast<uint16_t>(Req::kOpcode);
      auto& family = families_[op >> 8];
      if (family.size() <= (op & 0xffu)) family.resize((op & 0xffu) + 1, nullptr);
      if constexpr ((Req::kFlags & (ir::kBroker | ir::kPeer)) != 0)
        family[op & 0xffu] = &Session::RefuseBrokerCommand<Req>;
      else
        family[op & 0xffu] = &Session::Run<Req>;
    });
  }
  Handler Find(uint16_t op) const {
    const size_t family = op >> 8, index = op & 0xffu;
    if (family >= families_.size() || index >= families_[family].size()) return nullptr;
    return families_[family][index];
  }

 private:
  std::array<std::vector<Handler>, 256> families_;
};

const DispatchTable& Table() {
  static const DispatchTable table;
  return table;
}

// The event status a failed command leaves on its signal (ir::EventStatus): the API's own
// error when there is one, else the Tandem code beyond kEventFailedTandem; always negative.
int32_t FailedEventStatus(const Status& st) {
  if (st.code() == Code::kApiError && st.api() == Api::kOpenCL && st.native() < 0) return st.native();
  if (st.code() == Code::kApiError && st.api() == Api::kCuda && st.native() > 0) return -st.native();
  return -(ir::kEventFailedTandem + static_cast<int32_t>(st.code()));
}

}  // namespace

Session::Session(Backend* backend, uint64_t session_key, bool defer_replies)
    : backend_(backend), session_key_(session_key) {
  backend_->AllowDeferredReplies(defer_replies);
  profile_ = Profile::FromEnv();
  // Only where the backend asks for it: CUDA's legacy default stream, which waits for every
  // other stream, is not modelled by holding's per-stream order.
  hold_ = backend_->HoldsForPeers();
  if (const char* v = std::getenv("TANDEM_SERVER_HOLD"); v && *v) {
    if (std::string_view(v) == "0")
      hold_ = false;
    else if (std::string_view(v) != "1")
      log::Warn("TANDEM_SERVER_HOLD={}: not 0 or 1; holding stays {}", v, hold_ ? "on" : "off");
  }
  if (const char* v = std::getenv("TANDEM_ASYNC_PEER_BYTES"); v && *v) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end && *end == 0 && n <= kAsyncPeerBytes)
      async_peer_bytes_ = n;
    else
      log::Warn("TANDEM_ASYNC_PEER_BYTES={}: not a byte count up to {}; using {}", v, kAsyncPeerBytes, kAsyncPeerBytes);
  }
}

BatchOutcome Session::HandleBatch(std::span<const uint8_t> msg) {
  BatchOutcome outcome;
  ir::BatchWriter out(ir::BatchKind::kReplies);
  if (!attached_.load()) {
    if (!Authenticate(msg, out)) {
      outcome.refuse_peer = true;
      outcome.reply = out.Finish();
      return outcome;
    }
  }
  const auto batch_started = std::chrono::steady_clock::now();
  out_ = &out;
  DestroyFinishedImports();
  inline_reply_bytes_ = 0;
  TakeAsyncFailures();
  if (releases_due_.load()) TakeReleases();
  std::vector<ir::Record> records;
  Status st = ir::ParseBatch(msg, ir::BatchKind::kRequests, &records);
  if (!st.ok()) {
    // A malformed batch is answered with one record (opcode 0, seq 0) and the session goes on.
    ReplyError(ir::Record{}, st, out);
  } else {
    for (size_t i = 0; i < records.size(); ++i) {
      const ir::Record& rec = records[i];
      // Late replies run after the batch, in order: this command's would run next.
      backend_->set_wait_runs_next(i + 1 == records.size() && late_.empty() && waiter_idle_ && waiter_idle_());
      if (Handler h = Table().Find(rec.header.opcode)) {
        (this->*h)(rec, out);
      } else {
        ReplyError(rec,
                   Status(Code::kUnimplemented, fmt::format("unknown opcode 0x{:04x}", rec.header.opcode)), out);
      }
      if (goodbye_) break;
    }
    backend_->set_wait_runs_next(false);
  }
  out_ = nullptr;
  outcome.goodbye = goodbye_;
  outcome.reply = WithOutput(out);
  if (profile_) profile_->Add(fmt::format("(batch of {})", records.size() < 8 ? "<8" : records.size() < 64 ? "8-63" : ">=64"),
                              std::chrono::steady_clock::now() - batch_started);
  outcome.late = std::exchange(late_, {});
  return outcome;
}

// What the session's device code printed goes ahead of the batch's replies (as Output
// notifications, seq 0), so the program sees it before the sync that produced it.
std::vector<uint8_t> Session::WithOutput(ir::BatchWriter& replies) {
  auto output = backend_->TakeOutput();
  if (output.empty()) return replies.empty() ? std::vector<uint8_t>{} : replies.Finish();
  ir::BatchWriter out(ir::BatchKind::kReplies);
  for (auto& [fd, text] : output) {
    for (size_t at = 0; at < text.size(); at += ir::kMaxBytes) {
      const size_t n = std::min<size_t>(ir::kMaxBytes, text.size() - at);
      out.AddRequest(ir::OutputReq{fd, ir::bytes(text.begin() + at, text.begin() + at + n)}, 0);
    }
  }
  if (!replies.empty()) {
    std::vector<uint8_t> msg = replies.Finish();
    std::vector<ir::Record> records;
    Status st = ir::ParseBatch(msg, ir::BatchKind::kReplies, &records);
    if (!st.ok()) log::Error("internal: a reply batch this session built does not parse: {}", st.message());
    for (const ir::Record& r : records) out.AddRaw(r.header.opcode, r.header.flags, r.header.seq, r.payload);
  }
  return out.Finish();
}

// The first batch of a session must start with an Attach carrying the session key; the
// batch is then run normally (the Attach record answers with the device count).
bool Session::Authenticate(std::span<const uint8_t> msg, ir::BatchWriter& out) {
  std::vector<ir::Record> records;
  ir::AttachReq req;
  const bool ok = ir::ParseBatch(msg, ir::BatchKind::kRequests, &records).ok() && !records.empty() &&
                  records[0].header.opcode == static_cast<uint16_t>(ir::Opcode::kAttach) &&
                  ir::DecodeRequest(records[0].payload, &req).ok() && req.session_key == session_key_;
  if (ok) {
    attached_.store(true);
    return true;
  }
  const ir::Record first = records.empty() ? ir::Record{} : records[0];
  ReplyError(first, Status(Code::kAuth, "the first request of a session must be Attach with its session key"),
             out);
  return false;
}

std::optional<std::vector<uint8_t>> Session::RunUrgent(std::span<const uint8_t> msg) {
  if (!attached_.load()) return std::nullopt;
  std::vector<ir::Record> records;
  if (!ir::ParseBatch(msg, ir::BatchKind::kRequests, &records).ok() || records.empty()) return std::nullopt;
  for (const ir::Record& rec : records) {
    const ir::CommandInfo* c = ir::FindCommand(rec.header.opcode);
    if (!c || !(c->flags & ir::kUrgent)) return std::nullopt;  // the executor runs it, in order
    // A user event the executor has not created yet (its EventCreate is still queued) is
    // set in order by the executor; the client sends UserEventSet alone, so nothing runs twice.
    if (rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kUserEventSet) && records.size() != 1)
      return std::nullopt;
  }
  ir::BatchWriter out(ir::BatchKind::kReplies);
  bool queue_instead = false;
  for (const ir::Record& rec : records) {
    ir::ForEachCommand([&]<class Req>() {
      if constexpr ((Req::kFlags & ir::kUrgent) != 0) {
        if (rec.header.opcode != static_cast<uint16_t>(Req::kOpcode)) return;
        if (log::TraceEnabled()) log::Trace("urgent {}", ir::TraceRequest(rec.header.opcode, rec.payload));
        Req req;
        typename Req::Reply rep{};
        Status st = ir::DecodeRequest(rec.payload, &req);
        // Only completing a user event may overtake the queue: failing it early would fail
        // commands queued before it differently than natively (a marker enqueued on an
        // already-failed event). A failure is set in order by the executor.
        if constexpr (std::is_same_v<Req, ir::UserEventSetReq>) {
          if (st.ok() && req.status != ir::kEventComplete) {
            queue_instead = true;
            return;
          }
        }
        if (st.ok()) st = ExecuteUrgent(req, &rep);
        if (st.code() == Code::kUnknownHandle) {
          queue_instead = true;
          return;
        }
        // The deferred list belongs to the executor's thread: an urgent failure is answered now.
        if (!st.ok() || (Req::kFlags & ir::kNeedsReply) || (rec.header.flags & ir::kRecordWantReply))
          out.AddReply(rec.header.opcode, rec.header.seq, st, {}, st.ok() ? &rep : nullptr);
      }
    });
  }
  if (queue_instead) return std::nullopt;
  return out.empty() ? std::vector<uint8_t>{} : out.Finish();
}

Status Session::ExecuteUrgent(const ir::PingReq& req, ir::PingRep* rep) {
  rep->nonce = req.nonce;
  return Status::Ok();
}

// Backends make OnUserEventSet safe to call beside the executor (backend.h).
Status Session::ExecuteUrgent(const ir::UserEventSetReq& req, ir::UserEventSetRep* rep) {
  return backend_->OnUserEventSet(req, rep);
}

template <class Req>
Session::HoldKeys Session::KeysOf(const Req& req) {
  HoldKeys k;
  if constexpr (requires { req.stream; }) {
    k.stream = req.stream;
    k.has_stream = true;
  }
  if constexpr (requires { req.signal; }) k.signal = req.signal;
  if constexpr (requires { req.wait; }) k.events.insert(k.events.end(), req.wait.begin(), req.wait.end());
  if constexpr (requires { req.event; }) k.events.push_back(req.event);
  if constexpr (requires { req.events; }) k.events.insert(k.events.end(), req.events.begin(), req.events.end());
  if constexpr (std::is_same_v<Req, ir::EventElapsedReq>) k.events = {req.start, req.end};
  k.ends_objects = std::is_same_v<Req, ir::BufferFreeReq> || std::is_same_v<Req, ir::StreamDestroyReq> ||
                   std::is_same_v<Req, ir::ModuleFreeReq> || std::is_same_v<Req, ir::FunctionFreeReq> ||
                   std::is_same_v<Req, ir::EventDestroyReq> || std::is_same_v<Req, ir::DeviceSyncReq> ||
                   std::is_same_v<Req, ir::DeviceResetReq>;
  return k;
}

// A command waits for a held one, or for another server's answer, when it runs on a stream
// with a held command, waits on or names a pending event, or ends objects (or syncs a whole
// device) while anything is held.
bool Session::Blocked(const HoldKeys& k) const {
  if (k.has_stream && held_streams_.contains(k.stream)) return true;
  for (uint64_t e : k.events)
    if (Pending(e)) return true;
  return k.ends_objects && !held_.empty();
}

template <class Req>
void Session::Run(const ir::Record& rec, ir::BatchWriter& out) {
  if (log::TraceEnabled()) log::Trace("run #{} {}", rec.header.seq, ir::TraceRequest(rec.header.opcode, rec.payload));
  // A Launch, the command a program sends most, is decoded into one request per thread,
  // reused, so its vectors (grid, block, arguments and their bytes) are not allocated anew
  // for every record.
  Req local;
  Req& req = [&]() -> Req& {
    if constexpr (std::is_same_v<Req, ir::LaunchReq>) {
      static thread_local Req reused;
      return reused;
    } else {
      return local;
    }
  }();
  Status st = ir::DecodeRequest(rec.payload, &req);
  // A malformed record is always answered: its flags cannot be trusted to say otherwise.
  if (!st.ok()) return ReplyError(rec, st, out);
  // A PeerRecv holds itself (HoldArrival): its bytes are asked for at once.
  if constexpr (!std::is_same_v<Req, ir::PeerRecvReq>) {
    HoldKeys keys;
    if (Holding() && Blocked(keys = KeysOf(req))) {
      const bool wants = (Req::kFlags & ir::kNeedsReply) || (rec.header.flags & ir::kRecordWantReply);
      if constexpr (std::is_same_v<Req, ir::EventQueryReq>) {
        // Not with the backend yet: queued, as a command behind an unset event is.
        ir::EventQueryRep queued{.status = ir::kEventQueued};
        if (wants) Reply(rec, Status::Ok(), &queued, out);
        return;
      }
      if (!wants) {
        Hold(HeldCommand{rec.header, std::vector<uint8_t>(rec.payload.begin(), rec.payload.end()), nullptr,
                         std::move(keys)});
        return;
      }
      WaitUntil([&] { return !Holding() || !Blocked(keys); });
      // The held launches that ran meanwhile decoded into the same reused request.
      if constexpr (std::is_same_v<Req, ir::LaunchReq>) {
        st = ir::DecodeRequest(rec.payload, &req);
        if (!st.ok()) return ReplyError(rec, st, out);
      }
    }
  }
  // Counted where it runs: a read held above is counted once, in the batch that releases it.
  if constexpr (std::is_same_v<Req, ir::BufferReadReq>) {
    if (req.remote.len == 0 && req.remote.addr == 0) {  // the bytes come back in the reply
      if (req.size > kMaxInlineReplyBytes - inline_reply_bytes_)
        return ReplyError(rec,
                          Status(Code::kOverload, fmt::format("read back of {} bytes in the reply: one request message "
                                                              "may ask for at most {} such bytes",
                                                              req.size, kMaxInlineReplyBytes)),
                          out);
      inline_reply_bytes_ += req.size;
    }
  }
  current_seq_ = rec.header.seq;
  auto rep = std::make_shared<typename Req::Reply>();
  const auto started = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  backend_->set_caller_waits_alone((rec.header.flags & ir::kRecordCallerWaits) && backend_->wait_runs_next() &&
                                   !Holding());
  st = Execute(req, rep.get());
  const bool wait_in_place = backend_->WaitRunsInPlace() && !Holding();
  backend_->set_caller_waits_alone(false);
  if (profile_) profile_->Add(std::string(Req::kName), std::chrono::steady_clock::now() - started);
  if (log::TraceEnabled()) log::Trace("ran #{} {}: {}", rec.header.seq, Req::kName, st.ToString());
  commands_run_.fetch_add(1, std::memory_order_relaxed);
  // A protocol error (a command sent the wrong way) is answered at once, like a malformed one.
  const bool want_reply = (Req::kFlags & ir::kNeedsReply) || (rec.header.flags & ir::kRecordWantReply) ||
                          st.code() == Code::kProtocol;
  if (auto wait = backend_->TakeDeferredReply()) {
    // The command is enqueued; its reply waits on the device, off this thread, unless nobody
    // waits for an answer (finished here, in order), or it can wait here, as CUDA's
    // synchronize does: the client posts nothing more until the reply (kRecordCallerWaits:
    // one posting thread, no callbacks), the wait would run next anyway, and nothing it waits
    // for needs this thread meanwhile. The reply then leaves with the batch's, without the
    // hand-over to the waiter and the waiter's to the thread that reads the socket (about
    // 2.5 us of an OpenCL kernel + clFinish, the probe at c2a8741). The worker's other thread
    // takes over receiving meanwhile, as for any long batch. Without the client's flag a
    // second host thread's commands would queue behind this wait (8ff6a8c).
    if (!want_reply || wait_in_place || wait.in_place_only) {
      st = wait();
    } else {
      // It is the sync point for what came before it: it carries their deferred errors.
      const ir::RecordHeader head = rec.header;
      auto reply = [this, head, rep](const Status& done, std::vector<ir::AsyncError> errors) {
        if constexpr (std::is_same_v<Req, ir::BufferReadReq>) {
          if (done.ok()) MaybeFlip(rep->data);
        }
        ir::BatchWriter w(ir::BatchKind::kReplies);
        w.AddReply(head.opcode, head.seq, done, errors, done.ok() ? rep.get() : nullptr);
        return w.Finish();
      };
      late_.push_back(LateReply{std::move(wait), std::move(reply), TakeDeferred(), !backend_->EnqueuedCompleteAlone()});
      return;
    }
  }
  if constexpr (std::is_same_v<Req, ir::BufferReadReq>) {
    if (st.ok()) MaybeFlip(rep->data);
  }
  if constexpr (std::is_same_v<Req, ir::BufferDigestReq>) {
    if (st.ok()) MaybeFlip(rep->digests);
  }
  if (want_reply) return Reply(rec, st, rep.get(), out);
  if (!st.ok()) {
    uint64_t signal = 0, stream = 0;
    if constexpr (requires { req.signal; }) signal = req.signal;
    if constexpr (requires { req.stream; }) stream = req.stream;
    // Failed because an event it waited on had (Execute's first check), not by itself.
    bool waited = false;
    if constexpr (requires { req.wait; }) waited = !FailedWait(req.wait).ok();
    Defer(rec, st, signal, stream, waited);
  }
}

template <class Req>
void Session::RefuseBrokerCommand(const ir::Record& rec, ir::BatchWriter& out) {
  if constexpr ((Req::kFlags & ir::kPeer) != 0)
    ReplyError(rec, Status::Protocol(fmt::format("{} is exchanged between session workers, not sent by a client",
                                                 Req::kName)),
               out);
  else
    ReplyError(rec,
               Status::Protocol(fmt::format(
                   "{} is answered by the session broker (the --listen port), not by a session", Req::kName)),
               out);
}

// Every command that is not a session command goes to the backend. Commands that wait on
// an event whose command failed fail the same way, and a command's signal remembers its
// failure so EventQuery/EventWait can report it.
Status Session::FailedWait(const ir::u64s& wait) const {
  for (uint64_t e : wait) {
    auto it = failed_events_.find(e);
    if (it == failed_events_.end()) continue;
    return Status(it->second.status.code(),
                  fmt::format("waits on event {}, whose command failed: {}", e, it->second.status.message()),
                  it->second.status.native(), it->second.status.api());
  }
  return Status::Ok();
}

template <class Req>
Status Session::Execute(const Req& req, typename Req::Reply* rep) {
  if constexpr (requires { req.wait; }) {
    if (Status st = FailedWait(req.wait); !st.ok()) {
      if constexpr (requires { req.signal; }) NoteSignal(req.signal, st);
      return st;
    }
  }
  Status st = Call(req, rep);
  if constexpr (requires { req.signal; }) NoteSignal(req.signal, st);
  return st;
}

template <class Req>
Status Session::Call(const Req& req, typename Req::Reply* rep) {
  return CallBackend(*backend_, req, rep);
}

// Runs a backend transfer with `io` as its bulk channel instead of the client's. A reply the
// backend deferred is waited for here: these commands answer nobody.
Status Session::WithBulk(BulkIO* io, const std::function<Status()>& run) {
  BulkIO* saved = backend_->bulk();
  const bool client = backend_->bulk_is_client();
  backend_->set_bulk(io, io == saved && client);
  Status st = run();
  backend_->set_bulk(saved, client);
  if (auto wait = backend_->TakeDeferredReply()) {
    Status done = wait();
    if (st.ok()) st = done;
  }
  return st;
}

void Session::set_faults(const FaultInjection& faults) {
  faults_ = faults;
  rng_ = faults.seed ? faults.seed : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  rng_ |= 1;
  next_flip_ = {};
}

namespace {
uint64_t NextRandom(uint64_t& x) {  // xorshift64*: injection needs no more
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  return x * 0x2545F4914F6CDD1DULL;
}
}  // namespace

// Whether this read back gets a flip (flip_mu_ held).
bool Session::FlipDue() {
  const double u = static_cast<double>(NextRandom(rng_) >> 11) * 0x1.0p-53;
  if (faults_.bitflip_rate > 0) return u < faults_.bitflip_rate;
  if (faults_.bitflip_per_s <= 0) return false;
  const auto now = std::chrono::steady_clock::now();
  const bool first = next_flip_ == std::chrono::steady_clock::time_point{};
  if (!first && now < next_flip_) return false;
  // The next one an exponential wait after this one was due (a Poisson process in time from
  // the first read back); flips that fell due together land on the next read backs.
  const double wait_s = std::min(-std::log1p(-u) / faults_.bitflip_per_s, 1e6);
  next_flip_ = (first ? now : next_flip_) + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(wait_s));
  return !first;
}

void Session::MaybeFlip(std::vector<uint8_t>& data) {
  if ((faults_.bitflip_rate <= 0 && faults_.bitflip_per_s <= 0) || data.empty()) return;
  std::lock_guard<std::mutex> lock(flip_mu_);
  if (!FlipDue()) return;
  const uint64_t bit = NextRandom(rng_) % (data.size() * 8);
  data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  ++flips_;
  log::Warn("fault injection: flipped bit {} of a {}-byte read back", bit, data.size());
}

void Session::MaybeFlip(std::vector<uint64_t>& digests) {
  if ((faults_.bitflip_rate <= 0 && faults_.bitflip_per_s <= 0) || digests.empty()) return;
  std::lock_guard<std::mutex> lock(flip_mu_);
  if (!FlipDue()) return;
  const uint64_t bit = NextRandom(rng_) % (digests.size() * 64);
  digests[bit / 64] ^= 1ull << (bit % 64);
  ++flips_;
  log::Warn("fault injection: flipped bit {} of a digest", bit);
}

// Redundancy: digests of a range, read through the backend's ordinary inline read path (in
// pieces, so any size works) and hashed here, where the data is.
Status Session::Call(const ir::BufferDigestReq& req, ir::BufferDigestRep* rep) {
  constexpr uint64_t kPiece = 64u << 20;
  const uint64_t chunk = req.chunk ? req.chunk : req.size;
  if (req.size == 0) return Status::Invalid("BufferDigest: empty range");
  if (req.chunk != 0 && req.size / req.chunk >= ir::kMaxListItems / 2)
    return Status::Invalid(fmt::format("BufferDigest: {} chunks of {} bytes is too many", req.size / req.chunk, req.chunk));
  XXH3_state_t* state = XXH3_createState();
  if (!state) return Status(Code::kOutOfMemory, "BufferDigest: no hash state");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hold(state, XXH3_freeState);
  XXH3_128bits_reset(state);
  uint64_t in_chunk = 0;
  for (uint64_t at = 0; at < req.size;) {
    const uint64_t n = std::min({kPiece, req.size - at, chunk - in_chunk});
    ir::BufferReadReq read{.stream = req.stream, .buffer = req.buffer, .offset = req.offset + at, .size = n,
                           .remote = {}, .wait = at == 0 ? req.wait : ir::u64s{}, .signal = 0};
    ir::BufferReadRep piece;
    TANDEM_RETURN_IF_ERROR(WithBulk(backend_->bulk(), [&] { return backend_->OnBufferRead(read, &piece); }));
    if (piece.data.size() != n) return Status(Code::kInternal, "BufferDigest: the backend read a short piece");
    XXH3_128bits_update(state, piece.data.data(), n);
    at += n;
    in_chunk += n;
    if (in_chunk == chunk || at == req.size) {
      const XXH128_hash_t h = XXH3_128bits_digest(state);
      rep->digests.push_back(h.low64);
      rep->digests.push_back(h.high64);
      XXH3_128bits_reset(state);
      in_chunk = 0;
    }
  }
  if (req.signal) {
    // The signal completes with the digest: a marker in the same stream.
    ir::MarkerRep unused;
    TANDEM_RETURN_IF_ERROR(WithBulk(backend_->bulk(), [&] {
      return backend_->OnMarker(ir::MarkerReq{.stream = req.stream, .barrier = 0, .wait = {}, .signal = req.signal},
                                &unused);
    }));
  }
  return Status::Ok();
}

// Keepalive: checked here, run by the backend off the program's streams.
Status Session::Call(const ir::WarmReq& req, ir::WarmRep* rep) {
  if (req.data.size() > ir::kWarmMaxBytes || (req.what & ~(ir::kWarmCopy | ir::kWarmKernel)))
    return Status::Invalid(fmt::format("Warm: {} bytes (at most {}), paths {:#x}", req.data.size(), ir::kWarmMaxBytes,
                                       req.what));
  if (spin_hook_) spin_hook_(std::min<uint32_t>(req.spin_us, 20000));
  if (req.what == 0) return Status::Ok();  // only the spin window
  // Commands held for another server: the program's work is in flight and the device is busy
  // with it or about to be, so a copy and a kernel would only take device time from it (the
  // client sees a quiet link while it waits on one server and the others work through what
  // it enqueued). On NVIDIA's OpenCL with four servers time-slicing a GPU one such Warm held
  // the executor for 57 ms. The spin window above is what still helps; the reply comes
  // without the echoed bytes.
  if (!held_.empty()) {
    if (profile_) profile_->Add("~Warm skipped (held)", std::chrono::nanoseconds(0));
    return Status::Ok();
  }
  return backend_->OnWarm(req, rep);
}

// The source half of a server-to-server copy: a read of the buffer whose chunks go to the
// worker that pulls the transfer.
Status Session::Call(const ir::PeerSendReq& req, ir::PeerSendRep*) {
  if (!peers_) return Status(Code::kUnimplemented, "PeerSend: this session has no server-to-server transport");
  if (req.size == 0) return Status::Invalid("PeerSend: empty transfer");
  if (req.size <= async_peer_bytes_ && async_bytes_->Take(req.size)) {
    // Read in stream order into host memory; the link sends it when it is there and pulled,
    // while this thread goes on with the next command.
    PeerLink* peers = peers_;
    const uint64_t transfer = req.transfer, size = req.size;
    log::Trace("s2s send {:#x}: {} bytes from buffer {:#x} at {}", transfer, size, req.buffer, req.offset);
    auto read = [peers, transfer, size, in_flight = async_bytes_, profile = profile_,
                 since = std::chrono::steady_clock::now()](Result<std::shared_ptr<HostBuffer>> bytes) {
      if (profile) profile->Add("~PeerSend bytes read", std::chrono::steady_clock::now() - since);
      log::Trace("s2s send {:#x}: read done", transfer);
      if (!bytes.ok()) {
        in_flight->Give(size);
        peers->Offer(transfer, size, std::move(bytes));
        return;
      }
      peers->Offer(transfer, size, HostBytesBudget::Counted(in_flight, std::move(bytes).value()));
    };
    Status st =
        backend_->ReadToHost(req.stream, req.buffer, req.offset, req.size, req.wait, req.signal, std::move(read));
    if (st.code() != Code::kUnimplemented) {
      if (!st.ok()) {
        async_bytes_->Give(size);
        peers->Offer(transfer, size, st);  // the puller fails too
      }
      return st;
    }
    async_bytes_->Give(size);
  }
  auto io = peers_->Source(req.transfer, req.size);
  if (!io.ok()) return io.status();
  ir::BufferReadReq read{.stream = req.stream, .buffer = req.buffer, .offset = req.offset, .size = req.size,
                         .remote = ir::Region{0, req.size, 0}, .wait = req.wait, .signal = req.signal};
  ir::BufferReadRep unused;
  return WithBulk(io.value().get(), [&] { return backend_->OnBufferRead(read, &unused); });
}

// The destination half: a write of the buffer whose chunks come from the source worker.
Status Session::Call(const ir::PeerRecvReq& req, ir::PeerRecvRep*) {
  if (!peers_) return Status(Code::kUnimplemented, "PeerRecv: this session has no server-to-server transport");
  if (req.size == 0) return Status::Invalid("PeerRecv: empty transfer");
  if (req.size <= async_peer_bytes_ && async_bytes_->Take(req.size)) {
    if (hold_) return HoldArrival(req);
    // The write is enqueued now and held until the bytes are here; this thread goes on.
    log::Trace("s2s recv {:#x}: {} bytes into buffer {:#x} at {}", req.transfer, req.size, req.buffer, req.offset);
    auto pending = backend_->WriteFromHost(req.stream, req.buffer, req.offset, req.size, req.wait, req.signal);
    if (pending.ok()) {
      auto release = pending->release;
      auto arrived = [this, release, signal = req.signal, stream = req.stream, transfer = req.transfer,
                      since = std::chrono::steady_clock::now()](const Status& got) {
        if (profile_) profile_->Add("~PeerRecv bytes came", std::chrono::steady_clock::now() - since);
        log::Trace("s2s recv {:#x}: bytes came", transfer);
        if (!got.ok()) NoteAsyncFailure(ir::Opcode::kPeerRecv, signal, stream, got);  // before the write is let go
        release(got);
      };
      Status st = peers_->Expect(req.peer, req.transfer, HostBytesBudget::Counted(async_bytes_, std::move(pending->staging)),
                                 std::move(arrived));
      if (!st.ok()) release(st);
      return st;
    }
    async_bytes_->Give(req.size);
    if (pending.status().code() != Code::kUnimplemented) return pending.status();
  }
  // The streamed path writes from the executor: after what is held before it.
  if (hold_) WaitUntil([&, keys = KeysOf(req)] { return !Holding() || !Blocked(keys); });
  auto io = peers_->Sink(req.peer, req.transfer, req.size);
  if (!io.ok()) return io.status();
  ir::BufferWriteReq write{.stream = req.stream, .buffer = req.buffer, .offset = req.offset, .size = req.size,
                           .data = {}, .remote = ir::Region{0, req.size, 0}, .wait = req.wait, .signal = req.signal};
  ir::BufferWriteRep unused;
  return WithBulk(io.value().get(), [&] { return backend_->OnBufferWrite(write, &unused); });
}

// The exporting half of a cross-server event wait: when the event is done, the worker that
// imported it hears so from this one (PeerLink::ExportDone). A command here that already failed
// to signal it exports that failure.
Status Session::Call(const ir::EventExportReq& req, ir::EventExportRep*) {
  if (!peers_) return Status(Code::kUnimplemented, "EventExport: this session has no server-to-server transport");
  if (req.token == 0) return Status::Invalid("EventExport: token 0");
  PeerLink* peers = peers_;
  const uint64_t token = req.token;
  if (auto f = failed_events_.find(req.event); f != failed_events_.end()) {
    peers->ExportDone(token, f->second.event_status);
    return Status::Ok();
  }
  Status st = backend_->NotifyWhenDone(
      req.event, [peers, token, profile = profile_, since = std::chrono::steady_clock::now()](int32_t status) {
        if (profile) profile->Add("~EventExport done", std::chrono::steady_clock::now() - since);
        log::Trace("event export {:#x}: done", token);
        peers->ExportDone(token, status);
      });
  // The importer must not wait for ever on an event this side cannot watch.
  if (!st.ok()) peers->ExportDone(token, FailedEventStatus(st));
  return st;
}

// The importing half: a stand-in user event completed from the exporting worker's answer.
Status Session::Call(const ir::EventImportReq& req, ir::EventImportRep*) {
  if (!peers_) return Status(Code::kUnimplemented, "EventImport: this session has no server-to-server transport");
  if (req.token == 0) return Status::Invalid("EventImport: token 0");
  if (hold_) return HoldImport(req);
  ir::EventCreateRep created;
  TANDEM_RETURN_IF_ERROR(
      backend_->OnEventCreate(ir::EventCreateReq{.event = req.event, .device = req.device, .flags = ir::kEventUser},
                              &created));
  {
    std::lock_guard<std::mutex> lock(imports_mu_);
    imports_pending_[req.event] = false;
  }
  const uint64_t event = req.event;
  Status st = ImportFrom(req, [this, event](int32_t status) { CompleteImport(event, status); });
  if (!st.ok()) CompleteImport(event, FailedEventStatus(st));  // what waits on it fails instead of hanging
  return st;
}

// Asks the event's server for it; `answered` runs on the receive thread with its answer.
Status Session::ImportFrom(const ir::EventImportReq& req, std::function<void(int32_t status)> answered) {
  return peers_->Import(req.peer, req.token, [this, answered = std::move(answered), token = req.token,
                                              since = std::chrono::steady_clock::now()](int32_t status) {
    if (profile_) profile_->Add("~EventImport answered", std::chrono::steady_clock::now() - since);
    log::Trace("event import {:#x}: answered", token);
    answered(status);
  });
}

void Session::CompleteImport(uint64_t event, int32_t status) {
  ir::UserEventSetRep unused;
  Status st = backend_->OnUserEventSet(ir::UserEventSetReq{.event = event, .status = std::min(status, 0)}, &unused);
  if (!st.ok()) log::Warn("imported event {:#x}: {}", event, st.ToString());
  std::lock_guard<std::mutex> lock(imports_mu_);
  auto it = imports_pending_.find(event);
  if (it == imports_pending_.end()) return;
  if (it->second) imports_to_destroy_.push_back(event);
  imports_pending_.erase(it);
}

void Session::DestroyFinishedImports() {
  std::vector<uint64_t> done;
  {
    std::lock_guard<std::mutex> lock(imports_mu_);
    if (imports_to_destroy_.empty()) return;
    done.swap(imports_to_destroy_);
  }
  for (uint64_t event : done) {
    ir::EventDestroyRep unused;
    Status st = backend_->OnEventDestroy(ir::EventDestroyReq{event}, &unused);
    if (!st.ok()) log::Warn("imported event {:#x}: {}", event, st.ToString());
  }
}

void Session::NoteAsyncFailure(ir::Opcode opcode, uint64_t signal, uint64_t stream, const Status& st) {
  std::lock_guard<std::mutex> lock(async_mu_);
  async_failures_.push_back(AsyncFailure{opcode, signal, stream, st});
}

void Session::TakeAsyncFailures() {
  std::vector<AsyncFailure> failures;
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    failures.swap(async_failures_);
  }
  for (const AsyncFailure& f : failures) {
    ir::Record rec;
    rec.header.opcode = static_cast<uint16_t>(f.opcode);
    Defer(rec, f.status, f.signal, f.stream);
    NoteSignal(f.signal, f.status);
  }
}

void Session::NoteSignal(uint64_t signal, const Status& st) {
  if (signal == 0) return;
  if (st.ok())
    failed_events_.erase(signal);
  else
    failed_events_[signal] = FailedEvent{st, FailedEventStatus(st)};
}

Status Session::Execute(const ir::AttachReq& req, ir::AttachRep* rep) {
  if (req.session_key != session_key_) return Status(Code::kAuth, "wrong session key");
  rep->device_count = backend_->device_count();
  rep->backend = backend_->name();
  return Status::Ok();
}

Status Session::Execute(const ir::PingReq& req, ir::PingRep* rep) {
  rep->nonce = req.nonce;
  return Status::Ok();
}

Status Session::Execute(const ir::GoodbyeReq&, ir::GoodbyeRep*) {
  goodbye_ = true;
  if (profile_) {
    profile_->Log();
    backend_->LogProfile();
  }
  return Status::Ok();
}

Status Session::Execute(const ir::OutputReq&, ir::OutputRep*) {
  return Status::Protocol("Output is a notification from server to client, not a request");
}

// Resume opens a new connection to the worker (which answers it, see worker.cc); inside a
// session's command stream it is out of place.
Status Session::Execute(const ir::ResumeReq&, ir::ResumeRep*) {
  return Status::Protocol("Resume is sent alone, as the first message of a reconnecting client's new connection");
}

Status Session::Execute(const ir::AckReq&, ir::AckRep*) {
  return Status::Protocol("Ack is a notification from server to client, not a request");
}

Status Session::Execute(const ir::EventQueryReq& req, ir::EventQueryRep* rep) {
  if (auto it = failed_events_.find(req.event); it != failed_events_.end()) {
    rep->status = it->second.event_status;
    return Status::Ok();
  }
  return backend_->OnEventQuery(req, rep);
}

// Failed events answer from the session; the others are waited for by the backend, which
// may wait off the executor (OpenCL: ReplyLater) and answer once done: the statuses are
// merged after its wait, which this then wraps.
Status Session::Execute(const ir::EventWaitReq& req, ir::EventWaitRep* rep) {
  ir::EventWaitReq live;
  std::vector<std::optional<int32_t>> failed;  // per event of the request: its failure, if any
  for (uint64_t e : req.events) {
    auto it = failed_events_.find(e);
    failed.push_back(it == failed_events_.end() ? std::nullopt : std::optional<int32_t>(it->second.event_status));
    if (!failed.back()) live.events.push_back(e);
  }
  auto live_rep = std::make_shared<ir::EventWaitRep>();
  if (!live.events.empty()) {
    Status st = backend_->OnEventWait(live, live_rep.get());
    if (!st.ok()) {
      backend_->TakeDeferredReply();  // a wait it deferred before failing answers nobody now
      return st;
    }
  }
  auto merge = [failed = std::move(failed), live_rep, rep, n = live.events.size()] {
    if (live_rep->statuses.size() != n)
      return Status(Code::kInternal, "the backend answered EventWait with the wrong number of statuses");
    size_t next = 0;
    for (const std::optional<int32_t>& f : failed) rep->statuses.push_back(f ? *f : live_rep->statuses[next++]);
    return Status::Ok();
  };
  if (auto wait = backend_->TakeDeferredReply()) {
    backend_->DeferReply(DeferredWait{[wait = std::move(wait.wait), merge = std::move(merge)] {
                                        TANDEM_RETURN_IF_ERROR(wait());
                                        return merge();
                                      },
                                      std::move(wait.done), wait.in_place_only});
    return Status::Ok();
  }
  return merge();
}

// A failed event may never have reached the backend; destroying it only forgets it.
Status Session::Execute(const ir::EventDestroyReq& req, ir::EventDestroyRep* rep) {
  {
    // A stand-in whose answer has not come: commands may still wait on it, so it goes once
    // it is complete (CompleteImport).
    std::lock_guard<std::mutex> lock(imports_mu_);
    if (auto it = imports_pending_.find(req.event); it != imports_pending_.end()) {
      it->second = true;
      return Status::Ok();
    }
  }
  const bool was_failed = failed_events_.erase(req.event) > 0;
  Status st = backend_->OnEventDestroy(req, rep);
  if (was_failed && st.code() == Code::kUnknownHandle) return Status::Ok();
  return st;
}

void Session::ReplyError(const ir::Record& rec, const Status& st, ir::BatchWriter& out) {
  Reply<ir::PingRep>(rec, st, nullptr, out);
}

template <class Rep>
void Session::Reply(const ir::Record& rec, const Status& st, const Rep* rep, ir::BatchWriter& out) {
  out.AddReply(rec.header.opcode, rec.header.seq, st, TakeDeferred(), rep);
}

void Session::Defer(const ir::Record& rec, const Status& st, uint64_t signal, uint64_t stream, bool waited) {
  log::Debug("deferred error of {} seq {}: {}", ir::CommandName(rec.header.opcode), rec.header.seq, st.ToString());
  if (deferred_.size() >= kMaxDeferred) {
    ++deferred_dropped_;
    return;
  }
  deferred_.push_back(ir::AsyncError{rec.header.seq, rec.header.opcode, static_cast<uint32_t>(st.code()), st.native(),
                                     static_cast<uint32_t>(st.api()), signal, st.message(), stream, waited ? 1u : 0u});
}

std::vector<ir::AsyncError> Session::TakeDeferred() {
  std::vector<ir::AsyncError> out;
  out.swap(deferred_);
  if (deferred_dropped_) {
    out.push_back(ir::AsyncError{0, 0, static_cast<uint32_t>(Code::kOverload), 0, 0, 0,
                                 fmt::format("{} more asynchronous errors were dropped", deferred_dropped_)});
    deferred_dropped_ = 0;
  }
  return out;
}

// ---- holding ----------------------------------------------------------------------------

void Session::Hold(HeldCommand command) {
  if (!replaying_ && log::TraceEnabled())
    log::Trace("held #{} {}", command.header.seq, ir::CommandName(command.header.opcode));
  if (command.keys.has_stream) held_streams_.insert(command.keys.stream);
  if (command.keys.signal) held_signals_.insert(command.keys.signal);
  held_.push_back(std::move(command));
}

// The bytes are asked for now, into host memory of the transfer's own; the write waits in
// the held list, in stream order, until they are here and nothing before it holds it.
Status Session::HoldArrival(const ir::PeerRecvReq& req) {
  log::Trace("s2s recv {:#x}: {} bytes into buffer {:#x} at {} (held)", req.transfer, req.size, req.buffer, req.offset);
  auto a = std::make_shared<Arrival>();
  a->req = req;
  a->seq = current_seq_;
  a->bytes = HostBytesBudget::Counted(async_bytes_, std::make_shared<HeapHostBuffer>(req.size));
  Hold(HeldCommand{ir::RecordHeader{.opcode = static_cast<uint16_t>(ir::Opcode::kPeerRecv), .seq = current_seq_}, {}, a,
                   KeysOf(req)});
  Status st = peers_->Expect(req.peer, req.transfer, a->bytes,
                             [this, a, transfer = req.transfer, since = std::chrono::steady_clock::now()](const Status& got) {
                               if (profile_) profile_->Add("~PeerRecv bytes came", std::chrono::steady_clock::now() - since);
                               log::Trace("s2s recv {:#x}: bytes came", transfer);
                               PostRelease([a, got] {
                                 a->came = true;
                                 a->status = got;
                               });
                             });
  if (!st.ok()) {  // fails in its turn, like a transfer that broke off
    a->came = true;
    a->status = st;
  }
  return Status::Ok();
}

// Holding's import: the stand-in is a plain event that was never signalled (complete to the
// backend), so no command ever waits on a user event for it: what waits on it stays held until
// the answer, and a failure answered fails it here, as a failed command's signal fails.
Status Session::HoldImport(const ir::EventImportReq& req) {
  ir::EventCreateRep created;
  TANDEM_RETURN_IF_ERROR(
      backend_->OnEventCreate(ir::EventCreateReq{.event = req.event, .device = req.device, .flags = 0}, &created));
  const uint64_t event = req.event;
  unanswered_.insert(event);
  failed_events_.erase(event);
  const Api api = backend_->name().starts_with("opencl") ? Api::kOpenCL : Api::kNone;
  auto answer = [this, event, api](int32_t status) {
    unanswered_.erase(event);
    if (status >= 0) return;
    failed_events_[event] = FailedEvent{
        Status(Code::kApiError, fmt::format("its command failed on the server it was imported from (status {})", status),
               status, api),
        status};
  };
  Status st = ImportFrom(req, [this, answer](int32_t status) { PostRelease([answer, status] { answer(status); }); });
  if (!st.ok()) answer(FailedEventStatus(st));  // what waits on it fails instead of hanging
  return st;
}

void Session::RunArrival(Arrival& a) {
  Status st = a.status;
  bool waited = false;
  if (st.ok()) waited = !(st = FailedWait(a.req.wait)).ok();
  // The backend keeps the bytes (and so their place in the budget) until it has read them.
  if (st.ok()) st = backend_->WriteHostBytes(a.req.stream, a.req.buffer, a.req.offset, a.req.wait, a.req.signal,
                                             std::move(a.bytes));
  if (auto wait = backend_->TakeDeferredReply()) {
    Status done = wait();
    if (st.ok()) st = done;
  }
  NoteSignal(a.req.signal, st);
  log::Trace("s2s recv {:#x}: written: {}", a.req.transfer, st.ToString());
  a.bytes.reset();
  if (!st.ok()) {
    ir::Record rec;
    rec.header.opcode = static_cast<uint16_t>(ir::Opcode::kPeerRecv);
    rec.header.seq = a.seq;
    Defer(rec, st, a.req.signal, a.req.stream, waited);
  }
}

void Session::PostRelease(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    releases_.push_back(std::move(fn));
    releases_due_.store(true);
  }
  release_cv_.notify_all();
  if (wake_) wake_();
}

void Session::TakeReleases() {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    due.swap(releases_);
    releases_due_.store(false);
  }
  for (auto& fn : due) fn();
  Replay();
}

// Runs the held commands again in order: each goes to the backend, or is held again when
// something before it still holds it.
void Session::Replay() {
  if (replaying_ || held_.empty()) return;
  replaying_ = true;
  backend_->set_wait_runs_next(false);
  std::deque<HeldCommand> queue;
  queue.swap(held_);
  held_streams_.clear();
  held_signals_.clear();
  ir::BatchWriter scratch(ir::BatchKind::kReplies);
  ir::BatchWriter& out = out_ ? *out_ : scratch;
  while (!queue.empty()) {
    HeldCommand c = std::move(queue.front());
    queue.pop_front();
    if ((c.arrival && !c.arrival->came) || (Holding() && Blocked(c.keys))) {
      Hold(std::move(c));
      continue;
    }
    if (c.arrival) {
      RunArrival(*c.arrival);
      continue;
    }
    const ir::Record rec{c.header, c.payload};
    if (Handler h = Table().Find(rec.header.opcode)) (this->*h)(rec, out);  // holds it again if it must
  }
  if (!scratch.empty()) log::Warn("held commands answered outside a batch: {} bytes of replies dropped", scratch.Finish().size());
  replaying_ = false;
}

void Session::WaitUntil(const std::function<bool()>& ready) {
  while (!ready()) {
    {
      std::unique_lock<std::mutex> lock(release_mu_);
      release_cv_.wait(lock, [this] { return !releases_.empty(); });
    }
    TakeReleases();
  }
}

BatchOutcome Session::RunReleased() {
  BatchOutcome outcome;
  ir::BatchWriter out(ir::BatchKind::kReplies);
  out_ = &out;
  DestroyFinishedImports();
  inline_reply_bytes_ = 0;
  TakeAsyncFailures();
  TakeReleases();
  out_ = nullptr;
  if (!out.empty()) outcome.reply = WithOutput(out);
  outcome.late = std::exchange(late_, {});
  return outcome;
}

}  // namespace tandem::server
