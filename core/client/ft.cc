#include "ft.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "stats.h"
#include "tandem/log.h"

namespace tandem::client {
namespace {

constexpr uint64_t kChunk = 1u << 20;  // checkpoint granularity

bool IsLinkLoss(const Status& st) { return st.code() == Code::kLinkLost || st.code() == Code::kServerLost; }

std::vector<std::string> SplitList(const char* v) {
  std::vector<std::string> out;
  if (!v) return out;
  std::string s(v), item;
  for (char c : s + ",") {
    if (c == ',' || c == ' ') {
      if (!item.empty()) out.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  return out;
}

// How long a recovery waits for the program to set its user events (RecoveryLoop).
constexpr auto kUserEventGrace = std::chrono::seconds(10);

uint64_t FirstU64(const std::vector<uint8_t>& p, size_t at = 0) {
  uint64_t v = 0;
  if (p.size() >= at + 8) std::memcpy(&v, p.data() + at, 8);
  return v;
}

template <class Req>
std::vector<uint8_t> Encode(const Req& req) {
  std::vector<uint8_t> out;
  ir::Writer w(&out);
  ir::Put(w, req);
  return out;
}

using Digest = std::pair<uint64_t, uint64_t>;

Digest Hash(std::span<const uint8_t> data) {
  const XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return {h.low64, h.high64};
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// For messages: "buffer 7" or "the module global at 0x7f0000001000".
std::string RegionName(const std::pair<uint64_t, uint64_t>& key) {
  return key.first ? fmt::format("buffer {}", key.first) : fmt::format("the module global at {:#x}", key.second);
}

// Creation commands: kept (with their configuration) while their object lives.
bool IsCreate(ir::Opcode op) {
  switch (op) {
    case ir::Opcode::kAddressReserve:
    case ir::Opcode::kBufferAlloc:
    case ir::Opcode::kModuleLoad:
    case ir::Opcode::kModuleBuild:
    case ir::Opcode::kFunctionGet:
    case ir::Opcode::kFunctionSetAttr:
    case ir::Opcode::kModuleGlobal:  // makes the symbol addressable; goes with its module
    case ir::Opcode::kStreamCreate:
    case ir::Opcode::kEventCreate:
      return true;
    default:
      return false;
  }
}

bool IsDestroy(ir::Opcode op) {
  switch (op) {
    case ir::Opcode::kBufferFree:
    case ir::Opcode::kModuleFree:
    case ir::Opcode::kFunctionFree:
    case ir::Opcode::kStreamDestroy:
    case ir::Opcode::kEventDestroy:
      return true;
    default:
      return false;
  }
}

// The event a command signals (its `signal` field), or 0.
uint64_t SignalOf(uint16_t opcode, const std::vector<uint8_t>& payload) {
  uint64_t signal = 0;
  ir::ForEachCommand([&]<class Req>() {
    if constexpr (requires(Req r) { r.signal; }) {
      if (opcode != static_cast<uint16_t>(Req::kOpcode)) return;
      Req req;
      if (ir::DecodeRequest(payload, &req).ok()) signal = req.signal;
    }
  });
  return signal;
}

// Posts to a fresh session the objects a replica had (`creates`, in creation order) and makes
// the events its commands had signalled (`signals`) exist again, complete.
void Recreate(SessionImpl* s, const std::vector<std::pair<uint16_t, std::vector<uint8_t>>>& creates,
              const std::set<uint64_t>& signals) {
  for (const auto& [opcode, payload] : creates) s->PostRaw(opcode, payload, nullptr);
  for (uint64_t e : signals) s->Post(ir::MarkerReq{.stream = 0, .barrier = 0, .wait = {}, .signal = e});
}

}  // namespace

// ---- configuration ------------------------------------------------------------------------

FtConfig FtConfig::FromEnv() {
  FtConfig c;
  if (const char* v = std::getenv("TANDEM_REDUNDANCY")) c.redundancy = std::max(1, std::atoi(v));
  c.spares = SplitList(std::getenv("TANDEM_SPARE_SERVERS"));
  double period = 10;
  if (const char* v = std::getenv("TANDEM_CHECKPOINT_PERIOD")) period = std::max(0.0, std::atof(v));
  c.checkpoint_period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period));
  if (const char* v = std::getenv("TANDEM_LOG_LIMIT")) {
    char* end = nullptr;
    double n = std::strtod(v, &end);
    const char unit = end && *end ? static_cast<char>(std::toupper(*end)) : 0;
    const double scale = unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
    if (n > 0) c.log_limit = static_cast<size_t>(n * scale);
  }
  if (const char* v = std::getenv("TANDEM_MAX_RETRIES")) c.max_retries = std::max(1, std::atoi(v));
  return c;
}

// ---- one command as fault tolerance follows it ---------------------------------------------

struct FaultTolerance::Op {
  uint64_t id = 0;
  GroupSession* group = nullptr;
  uint16_t opcode = 0;
  std::vector<uint8_t> payload;
  RawReplyFn fn;
  bool read = false;    // a voted read back
  bool logged = false;  // in the log: a replay answers it
  struct Answer {
    bool in = false;
    Status st;
    std::vector<uint8_t> fields;
  };
  std::mutex m;
  uint64_t issue = 0;
  uint64_t generation = 0;  // the recovery generation it was last issued in
  std::vector<Answer> answers;
  std::vector<bool> carries_data;
  int waiting = 0;
  bool delivered = false;
};

// ---- GroupSession ---------------------------------------------------------------------------

GroupSession::GroupSession(FaultTolerance* ft, std::vector<SessionImpl*> replicas, std::vector<std::string> addresses)
    : ft_(ft), replicas_(std::move(replicas)), addresses_(std::move(addresses)) {
  for (size_t i = 0; i < addresses_.size(); ++i) name_ += (i ? "+" : "") + addresses_[i];
  backend_ = replicas_.front()->backend();
  outvoted_.assign(replicas_.size(), 0);
  for (size_t i = 1; i < replicas_.size(); ++i) replicas_[i]->set_forward_output(false);
}

const std::string& GroupSession::worker_address() const {
  std::lock_guard<std::mutex> lock(ft_->mu_);
  return replicas_.front()->worker_address();
}

uint64_t GroupSession::PostRaw(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) {
  return ft_->Post(this, opcode, std::move(payload), std::move(fn));
}

Status GroupSession::Flush() {
  std::vector<SessionImpl*> replicas;
  {
    std::lock_guard<std::mutex> lock(ft_->mu_);
    if (!failed_.ok()) return failed_;
    replicas = replicas_;
  }
  // Outside the lock: a send to a dead server blocks until it is declared lost, and the
  // recovery that follows needs the lock. A lost replica is recovered, not reported.
  for (SessionImpl* s : replicas) s->Flush();
  return Status::Ok();
}

Status GroupSession::CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) {
  return PostAndWait(*this, opcode, std::move(payload), reply_fields);
}

std::vector<ir::AsyncError> GroupSession::TakeAsyncErrors() {
  std::lock_guard<std::mutex> lock(ft_->mu_);
  ft_->GatherErrors(this);
  std::vector<ir::AsyncError> out;
  out.swap(held_errors_);
  return out;
}

Status GroupSession::health() const {
  std::lock_guard<std::mutex> lock(ft_->mu_);
  return failed_;
}

// ---- FaultTolerance -------------------------------------------------------------------------

FaultTolerance::FaultTolerance(FtConfig config, SessionSource* source)
    : config_(std::move(config)), source_(source), spares_(config_.spares.begin(), config_.spares.end()) {
  thread_ = std::thread([this] { RecoveryLoop(); });
  thread_.detach();  // lives as long as the process (the runtime is never destroyed)
  log::Info("fault tolerance: redundancy {}, {} spare server(s), checkpoint every {:.1f} s, log limit {} MiB",
            config_.redundancy, config_.spares.size(), Seconds(config_.checkpoint_period), config_.log_limit >> 20);
}

FaultTolerance::~FaultTolerance() = default;

GroupSession* FaultTolerance::AddGroup(std::vector<SessionImpl*> replicas, std::vector<std::string> addresses) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(std::make_unique<GroupSession>(this, std::move(replicas), std::move(addresses)));
  return groups_.back().get();
}

std::string FaultTolerance::TakeSpare() {
  std::lock_guard<std::mutex> lock(mu_);
  if (spares_.empty()) return "";
  std::string s = spares_.front();
  spares_.pop_front();
  return s;
}

void FaultTolerance::StartStandby() {
  std::lock_guard<std::mutex> lock(mu_);
  PrepareStandby();
}

void FaultTolerance::SettleStandby(std::chrono::milliseconds max) {
  std::shared_ptr<Standby> standby;
  {
    std::lock_guard<std::mutex> lock(mu_);
    standby = standby_;
  }
  if (!standby) return;
  std::unique_lock<std::mutex> l(standby->m);
  if (!standby->cv.wait_for(l, max, [&] { return standby->done; }))
    log::Info("fault tolerance: the standby session on {} is still being opened at exit", standby->address);
}

void FaultTolerance::PrepareStandby() {
  if (spares_.empty() || (standby_ && standby_->address == spares_.front())) return;
  auto standby = std::make_shared<Standby>();
  standby->address = spares_.front();
  standby_ = standby;
  // Detached: the runtime (the source) lives as long as the process.
  std::thread([standby, source = source_] {
    Result<SessionImpl*> opened = source->Open(standby->address);
    if (opened.ok()) log::Info("fault tolerance: {} stands by as the next spare", standby->address);
    else log::Info("fault tolerance: the next spare {} cannot stand by: {}", standby->address, opened.status().message());
    std::lock_guard<std::mutex> l(standby->m);
    standby->session = std::move(opened);
    standby->done = true;
    standby->cv.notify_all();
  }).detach();
}

Result<SessionImpl*> FaultTolerance::OpenSpare(const std::string& address) {
  if (std::shared_ptr<Standby> standby = standby_; standby && standby->address == address) {
    standby_.reset();
    std::unique_lock<std::mutex> l(standby->m);
    standby->cv.wait(l, [&] { return standby->done; });
    if (standby->session.ok() && standby->session.value()->health().ok()) return standby->session;
    if (standby->session.ok()) source_->Retire(standby->session.value());
    // It failed or died since: the spare may be back by now.
  }
  return source_->Open(address);
}

void FaultTolerance::NoteCreate(GroupSession* g, uint16_t opcode, const std::vector<uint8_t>& payload) {
  const auto op = static_cast<ir::Opcode>(opcode);
  if (const uint64_t signal = SignalOf(opcode, payload)) g->signals_.insert(signal);
  if (IsCreate(op)) {
    g->creates_.emplace_back(opcode, payload);
  } else if (IsDestroy(op)) {
    if (op == ir::Opcode::kEventDestroy) g->signals_.erase(FirstU64(payload));
    // Handles are unique across kinds: everything created under this one goes.
    const uint64_t handle = FirstU64(payload);
    std::erase_if(g->creates_, [&](const auto& c) {
      const auto cop = static_cast<ir::Opcode>(c.first);
      return cop != ir::Opcode::kAddressReserve && FirstU64(c.second) == handle;
    });
  }
}

uint64_t FaultTolerance::Post(GroupSession* g, uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) {
  const ir::CommandInfo* info = ir::FindCommand(opcode);
  const uint32_t flags = info ? info->flags : 0;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !recovering_; });
  if (!g->failed_.ok()) {
    Status why = g->failed_;
    lock.unlock();
    if (fn) fn(why, {});
    return 0;
  }
  const bool read = opcode == static_cast<uint16_t>(ir::Opcode::kBufferRead) && fn;
  NoteUserEvent(opcode, payload);
  // A checkpoint is taken at a read back, once the period has passed or the log is full, and
  // no user event is unset: its Quiesce would wait for the program to set it, and the program
  // cannot while this lock is held (natively a read of another stream does not wait for it).
  const bool due =
      read && (!have_ckpt_ || Clock::now() - last_ckpt_ >= config_.checkpoint_period || log_bytes_ >= config_.log_limit);
  if (due && !unset_user_events_.empty() && !told_deferred_) {
    told_deferred_ = true;
    log::Info("fault tolerance: checkpoints wait while user events are unset ({} now)", unset_user_events_.size());
  }
  if (due && unset_user_events_.empty()) {
    recovering_ = true;
    ++generation_;
    touched_.clear();
    Status st = Checkpoint();
    ReissueOpen();  // after a rollback the checkpoint ran into
    recovering_ = false;
    cv_.notify_all();
    if (!st.ok()) log::Warn("fault tolerance: checkpoint skipped: {}", st.message());
  }
  auto op = std::make_shared<Op>();
  op->id = next_op_++;
  op->group = g;
  op->opcode = opcode;
  op->read = read;
  op->logged = (flags & ir::kLogged) != 0;
  op->fn = std::move(fn);
  if (op->logged) {
    NoteCreate(g, opcode, payload);
    log_bytes_ += payload.size();
  }
  op->payload = std::move(payload);
  if (op->logged || op->read) log_.push_back(LogEntry{g, opcode, op->payload, op->fn || op->read ? op : nullptr});
  if (op->fn) {
    // Deliver erases from the receiver thread, which does not hold mu_.
    std::lock_guard<std::mutex> l(tasks_mu_);
    open_[op->id] = op;
  }
  Issue(op);
  return op->id;
}

void FaultTolerance::NoteUserEvent(uint16_t opcode, const std::vector<uint8_t>& payload) {
  switch (static_cast<ir::Opcode>(opcode)) {
    case ir::Opcode::kEventCreate: {
      ir::EventCreateReq req;
      if (ir::DecodeRequest(payload, &req).ok() && (req.flags & ir::kEventUser)) unset_user_events_.insert(req.event);
      break;
    }
    case ir::Opcode::kUserEventSet:
    case ir::Opcode::kEventDestroy:
      if (unset_user_events_.erase(FirstU64(payload)) && unset_user_events_.empty()) cv_.notify_all();
      break;
    default:
      break;
  }
}

void FaultTolerance::Issue(const std::shared_ptr<Op>& op) {
  GroupSession* g = op->group;
  const size_t n = g->replicas_.size();
  std::vector<size_t> targets;
  uint64_t issue;
  {
    std::lock_guard<std::mutex> l(op->m);
    issue = ++op->issue;
    op->generation = generation_;
    op->answers.assign(n, {});
    op->carries_data.assign(n, false);
    // Reads and logged commands go to every replica; a query to the primary only.
    const bool all = op->read || op->logged || !op->fn;
    for (size_t i = 0; i < (all ? n : 1); ++i) targets.push_back(i);
    if (op->read)
      for (size_t i = 0; i < std::min<size_t>(n >= 3 ? 2 : 1, n); ++i) op->carries_data[i] = true;
    op->waiting = op->fn ? static_cast<int>(targets.size()) : 0;
  }
  ir::BufferReadReq read;
  if (op->read && !ir::DecodeRequest(op->payload, &read).ok()) {
    Deliver(op, Status::Protocol("malformed BufferRead under fault tolerance"), {});
    return;
  }
  for (size_t i : targets) {
    uint16_t opcode = op->opcode;
    std::vector<uint8_t> payload = op->payload;
    if (op->read && !op->carries_data[i]) {
      opcode = static_cast<uint16_t>(ir::Opcode::kBufferDigest);
      payload = Encode(ir::BufferDigestReq{.stream = read.stream, .buffer = read.buffer, .offset = read.offset,
                                           .size = read.size, .chunk = 0, .wait = read.wait, .signal = read.signal});
    }
    RawReplyFn answer;
    if (op->fn)
      answer = [this, op, issue, i](const Status& st, std::span<const uint8_t> fields) { OnAnswer(op, issue, i, st, fields); };
    g->replicas_[i]->PostRaw(opcode, std::move(payload), std::move(answer));
  }
}

void FaultTolerance::OnAnswer(const std::shared_ptr<Op>& op, uint64_t issue, size_t replica, const Status& st,
                              std::span<const uint8_t> fields) {
  {
    std::lock_guard<std::mutex> l(op->m);
    if (op->issue != issue || op->delivered || replica >= op->answers.size()) return;
    auto& a = op->answers[replica];
    a.in = true;
    a.st = st;
    a.fields.assign(fields.begin(), fields.end());
    if (--op->waiting > 0) return;
  }
  Evaluate(op, issue);
}

// All answers of an issue are in (receiver thread, or inline from a post to a lost session).
bool FaultTolerance::Current(const std::shared_ptr<Op>& op, uint64_t issue) {
  std::lock_guard<std::mutex> l(op->m);
  return !op->delivered && op->issue == issue;
}

void FaultTolerance::Evaluate(const std::shared_ptr<Op>& op, uint64_t issue) {
  std::vector<Op::Answer> answers;
  std::vector<bool> carries;
  {
    std::lock_guard<std::mutex> l(op->m);
    if (op->delivered) return;
    answers = op->answers;
    carries = op->carries_data;
  }
  const size_t n = answers.size();
  if (op->opcode == static_cast<uint16_t>(ir::Opcode::kModuleGlobal)) {
    // The program addresses a global by the primary's address on every replica: they must
    // agree (a fault-tolerant client's workers run without address randomization, so the
    // driver places a module's globals alike in each).
    const Op::Answer* first = nullptr;
    for (const auto& a : answers) {
      if (!a.in || IsLinkLoss(a.st) || !a.st.ok()) continue;
      if (first && a.fields != first->fields) {
        log::Error("fault tolerance: a module global lies at different addresses on the replicas of {}: not "
                   "supported under redundancy",
                   op->group->name_);
        return Deliver(op, Status(Code::kUnimplemented, "a module global at different addresses on the replicas"), {});
      }
      if (!first) first = &a;
    }
  }
  if (!op->read) {
    // The primary's answer, or any replica's that is not a lost link.
    for (size_t i = 0; i < n; ++i)
      if (answers[i].in && !IsLinkLoss(answers[i].st)) return Deliver(op, answers[i].st, answers[i].fields);
    return;  // every target lost: the recovery re-issues it (or its replay answers it)
  }
  // A voted read. Replicas that lost their link do not vote; the recovery replaces them.
  std::vector<std::optional<Digest>> digests(n);
  size_t voters = 0, data_voters = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& a = answers[i];
    if (!a.in || IsLinkLoss(a.st)) continue;
    ++voters;
    if (!a.st.ok()) {
      // The API's own error (a bad read): the program gets it, as natively.
      if (carries[i]) return Deliver(op, a.st, {});
      continue;
    }
    ir::Reader r(a.fields);
    if (carries[i]) {
      ir::BufferReadRep rep;
      if (ir::Get(r, &rep)) digests[i] = Hash(rep.data), ++data_voters;
    } else {
      ir::BufferDigestRep rep;
      if (ir::Get(r, &rep) && rep.digests.size() == 2) digests[i] = Digest{rep.digests[0], rep.digests[1]};
    }
  }
  if (data_voters == 0) return;  // the bytes must be fetched again once the group is whole
  std::map<Digest, std::vector<size_t>> votes;
  for (size_t i = 0; i < n; ++i)
    if (digests[i]) votes[*digests[i]].push_back(i);
  const std::vector<size_t>* best = nullptr;
  for (const auto& [d, who] : votes)
    if (!best || who.size() > best->size()) best = &who;
  const bool unanimous = best && best->size() == voters;
  const bool majority = best && best->size() * 2 > n && n >= 3;
  if (unanimous || majority) {
    size_t from = n;  // the first replica with the winning bytes
    for (size_t i : *best) {
      if (carries[i]) {
        from = i;
        break;
      }
    }
    std::vector<size_t> outvoted;
    for (size_t i = 0; i < n; ++i)
      if (digests[i] && std::find(best->begin(), best->end(), i) == best->end()) outvoted.push_back(i);
    if (from < n) {
      if (unanimous) mismatch_streak_ = 0;
      Deliver(op, answers[from].st, answers[from].fields);
    }
    if (!outvoted.empty() || from == n)
      Schedule([this, op, issue, outvoted, from, n] {
        // Outvoted replicas are repaired even when the op was delivered; a vote a rollback
        // made stale is not acted on.
        if (from == n && !Current(op, issue)) return;
        OnMismatch(op, outvoted, true);
      });
    return;
  }
  Schedule([this, op, issue] {
    if (Current(op, issue)) OnMismatch(op, {}, false);  // else a rollback already re-issued it
  });
}

void FaultTolerance::Deliver(const std::shared_ptr<Op>& op, const Status& st, std::span<const uint8_t> fields) {
  {
    std::lock_guard<std::mutex> l(op->m);
    if (op->delivered) return;
    op->delivered = true;
  }
  {
    std::lock_guard<std::mutex> l(tasks_mu_);  // open_ is also read by the recovery thread
    open_.erase(op->id);
  }
  if (op->fn) op->fn(st, fields);
}

// ---- recovery -------------------------------------------------------------------------------

void FaultTolerance::Schedule(std::function<void()> task) {
  std::lock_guard<std::mutex> l(tasks_mu_);
  tasks_.push_back(std::move(task));
  tasks_cv_.notify_one();
}

void FaultTolerance::RecoveryLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> l(tasks_mu_);
      tasks_cv_.wait(l, [&] { return !tasks_.empty(); });
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !recovering_; });
    if (!unset_user_events_.empty()) {
      // The recovery's Quiesce would wait on streams they hold, with this lock held: let the
      // program's other threads set them first (a host callback's, set once it has run).
      log::Info("fault tolerance: the recovery waits for {} unset user event(s)", unset_user_events_.size());
      if (!cv_.wait_for(lock, kUserEventGrace, [&] { return unset_user_events_.empty(); }))
        log::Warn("fault tolerance: {} user event(s) still unset after {} s: recovering anyway (a stream they "
                  "hold may keep it waiting until they are set)",
                  unset_user_events_.size(), std::chrono::duration_cast<std::chrono::seconds>(kUserEventGrace).count());
      cv_.wait(lock, [&] { return !recovering_; });
    }
    recovering_ = true;
    ++generation_;
    touched_.clear();
    // What the replicas reported before the recovery touches them (a lost one included:
    // what it received is still there).
    for (auto& g : groups_) GatherErrors(g.get());
    task();
    ReissueOpen();
    recovering_ = false;
    cv_.notify_all();
  }
}

void FaultTolerance::OnSessionLost(SessionImpl* s) {
  Schedule([this, s] {
    for (auto& g : groups_) {
      if (const size_t i = g->IndexOf(s); i < g->replicas_.size()) {
        ReplaceLost(g.get(), i, s->health().message());
        return;
      }
    }
    // Not a member any more (retired by a rollback): nothing to do.
  });
}

// Ops of the groups a recovery touched that still wait: asked again of the group as it is
// now, unless the recovery re-issued them itself (a replay). Logged ops are answered by
// their replay or by a surviving replica, never sent twice.
void FaultTolerance::ReissueOpen() {
  std::vector<std::shared_ptr<Op>> open;
  {
    std::lock_guard<std::mutex> l(tasks_mu_);
    for (auto& [id, op] : open_) open.push_back(op);
  }
  for (auto& op : open) {
    if (!op->group->failed_.ok()) {
      Deliver(op, op->group->failed_, {});
      continue;
    }
    if (!touched_.contains(op->group)) continue;
    {
      std::lock_guard<std::mutex> l(op->m);
      if (op->delivered || op->generation == generation_ || (op->logged && !op->read)) continue;
    }
    Issue(op);
  }
}

std::vector<std::pair<FaultTolerance::RegionKey, uint64_t>> FaultTolerance::Regions(GroupSession* g) {
  std::vector<std::pair<RegionKey, uint64_t>> out;
  for (const auto& [opcode, payload] : g->creates_) {
    if (opcode == static_cast<uint16_t>(ir::Opcode::kBufferAlloc)) {
      ir::BufferAllocReq alloc;
      if (ir::DecodeRequest(payload, &alloc).ok() && alloc.size > 0) out.push_back({{alloc.buffer, 0}, alloc.size});
      continue;
    }
    if (opcode != static_cast<uint16_t>(ir::Opcode::kModuleGlobal)) continue;
    auto known = g->globals_.find(payload);
    if (known == g->globals_.end()) {
      // Asked once of every replica; a global they place differently was refused to the
      // program when it asked (Evaluate) and is not saved.
      std::optional<std::pair<uint64_t, uint64_t>> place;
      bool agree = true;
      for (SessionImpl* s : g->replicas_) {
        std::vector<uint8_t> fields;
        if (!s->CallRaw(opcode, payload, &fields).ok()) {
          agree = false;
          break;
        }
        ir::ModuleGlobalRep rep;
        ir::Reader r(fields);
        if (!ir::Get(r, &rep)) {
          agree = false;
          break;
        }
        if (place && *place != std::pair<uint64_t, uint64_t>{rep.address, rep.size}) agree = false;
        place = std::pair<uint64_t, uint64_t>{rep.address, rep.size};
      }
      if (!agree || !place) {
        log::Warn("fault tolerance: a module global of {} is not checkpointed: the replicas do not agree where it is",
                  g->name_);
        place = std::pair<uint64_t, uint64_t>{0, 0};  // asked once
      }
      known = g->globals_.emplace(payload, *place).first;
    }
    if (known->second.second > 0) out.push_back({{0, known->second.first}, known->second.second});
  }
  return out;
}

std::vector<uint64_t> FaultTolerance::Devices(const GroupSession* g) const {
  std::vector<uint64_t> out;
  for (const auto& [opcode, payload] : g->creates_) {
    uint64_t d = ~0ull;
    if (opcode == static_cast<uint16_t>(ir::Opcode::kBufferAlloc)) d = FirstU64(payload, 8);
    if (opcode == static_cast<uint16_t>(ir::Opcode::kAddressReserve)) d = FirstU64(payload, 0);
    if (d != ~0ull && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  if (out.empty()) out.push_back(0);
  return out;
}

void FaultTolerance::GatherErrors(GroupSession* g, SessionImpl* only) {
  for (SessionImpl* s : g->replicas_) {
    if (only && s != only) continue;
    std::vector<ir::AsyncError> errors = s->TakeAsyncErrors();
    const uint64_t before = s->ft_errors, after = before + errors.size();
    s->ft_errors = after;
    if (after <= g->errors_known_) continue;
    const size_t seen = static_cast<size_t>(g->errors_known_ > before ? g->errors_known_ - before : 0);
    g->held_errors_.insert(g->held_errors_.end(), std::make_move_iterator(errors.begin() + static_cast<long>(seen)),
                           std::make_move_iterator(errors.end()));
    g->errors_known_ = after;
  }
}

Status FaultTolerance::Quiesce(SessionImpl* s, const std::vector<uint64_t>& devices) {
  for (uint64_t d : devices) {
    std::vector<uint8_t> unused;
    Status st = s->CallRaw(static_cast<uint16_t>(ir::Opcode::kDeviceSync), Encode(ir::DeviceSyncReq{.device = d}), &unused);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

// Takes a coordinated checkpoint of every group (lock held, recovering_ set).
Status FaultTolerance::Checkpoint() {
  const auto start = Clock::now();
  Stats& stats = Stats::Get();
  // 1. Every replica of every group finishes what it was sent.
  for (auto& g : groups_) {
    const auto devices = Devices(g.get());
    for (SessionImpl* s : g->replicas_) TANDEM_RETURN_IF_ERROR(Quiesce(s, devices));
    GatherErrors(g.get());  // every error of a command before the cut, held until taken
  }
  uint64_t saved = 0;
  std::map<const GroupSession*, std::map<RegionKey, Region>> next;
  for (auto& g : groups_) {
    auto& old = ckpt_[g.get()];
    auto& regions = next[g.get()];
    for (const auto& [key, size] : Regions(g.get())) {
      const std::string what = RegionName(key);
      // 2. Per-chunk digests from every replica, compared.
      const size_t n = g->replicas_.size();
      std::vector<Result<ir::BufferDigestRep>> digests;
      for (SessionImpl* s : g->replicas_)
        digests.push_back(s->Call(ir::BufferDigestReq{.stream = 0, .buffer = key.first, .offset = key.second,
                                                      .size = size, .chunk = kChunk, .wait = {}, .signal = 0}));
      for (size_t i = 0; i < n; ++i)
        if (!digests[i].ok()) return digests[i].status();
      // The replicas that agree with most others; with N >= 3 a majority wins and only the
      // outvoted are restored from it, with N = 2 any disagreement rolls everything back.
      size_t good = 0, agree = 0;
      for (size_t i = 0; i < n; ++i) {
        size_t same = 0;
        for (size_t j = 0; j < n; ++j) same += digests[j]->digests == digests[i]->digests;
        if (same > agree) good = i, agree = same;
      }
      if (agree < n) {
        if (n < 3 || agree * 2 <= n) {
          stats.mismatches.fetch_add(n - agree);
          RollbackAll("replicas disagree on " + what + " at a checkpoint");
          return Status(Code::kInternal, "replicas disagreed at the checkpoint: rolled back instead");
        }
        for (size_t i = 0; i < n; ++i) {
          if (digests[i]->digests == digests[good]->digests) continue;
          stats.mismatches.fetch_add(1);
          log::Warn("fault tolerance: replica {} of {} is outvoted on {} at a checkpoint", i, g->name_, what);
          Status st = CopyFromPeer(g.get(), i, good);
          if (!st.ok()) return st;
        }
      }
      // 3. Only chunks that changed since the last checkpoint are fetched.
      Region& r = regions[key];
      r.size = size;
      const auto& d = digests[good]->digests;
      const size_t chunks = d.size() / 2;
      r.digests.resize(chunks);
      r.chunks.resize(chunks);
      auto prev = old.find(key);
      for (size_t c = 0; c < chunks; ++c) {
        r.digests[c] = {d[2 * c], d[2 * c + 1]};
        if (prev != old.end() && c < prev->second.digests.size() && prev->second.digests[c] == r.digests[c] &&
            prev->second.size == size) {
          r.chunks[c] = prev->second.chunks[c];
          continue;
        }
        const uint64_t off = c * kChunk, len = std::min<uint64_t>(kChunk, size - off);
        Status got = Status(Code::kInternal, "no replica returned the agreed bytes");
        for (SessionImpl* s : g->replicas_) {  // a flipped transfer is caught by its digest
          auto rep = s->Call(ir::BufferReadReq{.stream = 0, .buffer = key.first, .offset = key.second + off,
                                               .size = len, .remote = {}, .wait = {}, .signal = 0});
          if (rep.ok() && rep->data.size() == len && Hash(rep->data) == r.digests[c]) {
            r.chunks[c] = std::make_shared<const std::vector<uint8_t>>(std::move(rep->data));
            got = Status::Ok();
            break;
          }
          stats.mismatches.fetch_add(1);
        }
        TANDEM_RETURN_IF_ERROR(got);
        saved += len;
      }
    }
  }
  // 4. The cut is complete: it replaces the old one and the log starts again.
  ckpt_ = std::move(next);
  for (auto& g : groups_) {
    g->ckpt_creates_ = g->creates_;
    g->ckpt_signals_ = g->signals_;
    // Errors are numbered from the cut again (what is held stays held).
    GatherErrors(g.get());
    g->errors_known_ = 0;
    for (SessionImpl* s : g->replicas_) s->ft_errors = 0;
  }
  log_.clear();
  log_bytes_ = 0;
  last_ckpt_ = Clock::now();
  have_ckpt_ = true;
  stats.checkpoints.fetch_add(1);
  stats.checkpoint_bytes.fetch_add(saved);
  stats.checkpoint_ns.fetch_add(static_cast<uint64_t>(std::chrono::nanoseconds(Clock::now() - start).count()));
  log::Debug("fault tolerance: checkpoint of {} changed bytes in {:.3f} s", saved, Seconds(Clock::now() - start));
  return Status::Ok();
}

// A fresh session on `address` in the role of replica i of g: the objects of the checkpoint,
// its bytes, then (with replay_log) the group's log since.
Status FaultTolerance::RestoreFresh(GroupSession* g, size_t i, const std::string& address, bool replay_log) {
  // A spare's session may be open already; a replica restored where it was (a rollback
  // through fresh sessions) gets a new one.
  auto opened = OpenSpare(address);
  if (!opened.ok()) return opened.status();
  SessionImpl* s = opened.value();
  touched_.insert(g);
  s->set_forward_output(false);  // kernels replayed must not print twice
  SessionImpl* old = i < g->replicas_.size() ? g->replicas_[i] : nullptr;
  if (old) {
    g->replicas_[i] = s;
    g->addresses_[i] = address;
  } else {
    i = g->replicas_.size();
    g->replicas_.push_back(s);
    g->addresses_.push_back(address);
    g->outvoted_.push_back(0);
  }
  g->outvoted_[i] = 0;
  Recreate(s, g->ckpt_creates_, g->ckpt_signals_);
  // The program addresses its module globals where they were: the new worker's must be there.
  for (const auto& [payload, place] : g->globals_) {
    if (place.second == 0 || std::find(g->ckpt_creates_.begin(), g->ckpt_creates_.end(),
                  std::pair<uint16_t, std::vector<uint8_t>>{static_cast<uint16_t>(ir::Opcode::kModuleGlobal), payload}) ==
        g->ckpt_creates_.end())
      continue;
    std::vector<uint8_t> fields;
    ir::ModuleGlobalRep rep;
    Status st = s->CallRaw(static_cast<uint16_t>(ir::Opcode::kModuleGlobal), payload, &fields);
    ir::Reader r(fields);
    if (st.ok() && !(ir::Get(r, &rep) && rep.address == place.first && rep.size == place.second))
      st = Status(Code::kUnimplemented, fmt::format("the module global at {:#x} lies elsewhere on {}", place.first, address));
    if (!st.ok()) {
      source_->Retire(s);
      if (old) g->replicas_[i] = old;
      return st;
    }
  }
  for (const auto& [key, region] : ckpt_[g]) {
    for (size_t c = 0; c < region.chunks.size(); ++c) {
      const auto& bytes = *region.chunks[c];
      s->Post(ir::BufferWriteReq{.stream = 0, .buffer = key.first, .offset = key.second + c * kChunk,
                                 .size = bytes.size(), .data = bytes, .remote = {}, .wait = {}, .signal = 0});
    }
  }
  // The bytes went on each device's default stream: they must be in place before any
  // replayed command on another stream reads them.
  if (Status st = Quiesce(s, Devices(g)); !st.ok()) {
    source_->Retire(s);
    if (old) g->replicas_[i] = old;
    return st;
  }
  // The restore's own errors are not the program's; from here on s reports the errors of the
  // commands since the checkpoint, numbered from 0 (GatherErrors).
  s->TakeAsyncErrors();
  s->ft_errors = 0;
  uint64_t replayed = 0;
  if (replay_log) {
    // With no other healthy replica in its group (the only one, or every other one lost too
    // and not replaced yet), the new replica answers what is still open, where it stood: a
    // logged command is never asked again (ReissueOpen), so nobody else would.
    bool alone = true;
    for (size_t j = 0; j < g->replicas_.size(); ++j)
      if (j != i && g->replicas_[j]->health().ok()) alone = false;
    for (const LogEntry& e : log_) {
      if (e.group != g) continue;
      bool open = false;
      if (e.op) {
        std::lock_guard<std::mutex> l(e.op->m);
        open = !e.op->delivered;
      }
      if (open && alone) {
        Issue(e.op);
        continue;
      }
      if (e.opcode == static_cast<uint16_t>(ir::Opcode::kBufferRead)) continue;  // asked again by ReissueOpen
      s->PostRaw(e.opcode, e.payload, nullptr);
      ++replayed;
    }
  }
  Stats::Get().replayed.fetch_add(replayed);
  Status st = Quiesce(s, Devices(g));
  GatherErrors(g, s);  // the replay's: only those the lost state had not reported yet are new
  s->set_forward_output(i == 0);
  if (old) source_->Retire(old);
  return st;
}

// Replica `bad` becomes a copy of replica `good`, server to server.
Status FaultTolerance::CopyFromPeer(GroupSession* g, size_t bad, size_t good) {
  const auto devices = Devices(g);
  SessionImpl* to = g->replicas_[bad];
  SessionImpl* from = g->replicas_[good];
  touched_.insert(g);
  TANDEM_RETURN_IF_ERROR(Quiesce(from, devices));
  // `from` has reported every error of the program's commands now; `to`'s (a restored
  // replica's, or a spare's re-creations) are dropped with the copy's own, and `to` numbers
  // its errors on from where `from` stands.
  GatherErrors(g, from);
  const uint64_t position = from->ft_errors;
  TANDEM_RETURN_IF_ERROR(Quiesce(to, devices));
  uint64_t bytes = 0;
  for (const auto& [key, size] : Regions(g)) {
    // Always direct: this restore must not cross the client's link.
    const uint64_t transfer = NewTransferId();
    to->Post(ir::PeerRecvReq{.stream = 0, .buffer = key.first, .offset = key.second, .size = size,
                             .peer = from->worker_address(), .transfer = transfer, .wait = {}, .signal = 0});
    from->Post(ir::PeerSendReq{.stream = 0, .buffer = key.first, .offset = key.second, .size = size,
                               .transfer = transfer, .wait = {}, .signal = 0});
    bytes += size;
  }
  TANDEM_RETURN_IF_ERROR(Quiesce(to, devices));
  TANDEM_RETURN_IF_ERROR(Quiesce(from, devices));
  auto errors = to->TakeAsyncErrors();
  from->TakeAsyncErrors();  // only the copy's sends
  to->ft_errors = from->ft_errors = position;
  for (const auto& e : errors)
    if (e.opcode == static_cast<uint32_t>(ir::Opcode::kPeerRecv) || e.opcode == static_cast<uint32_t>(ir::Opcode::kPeerSend))
      return Status(Code::kInternal, "restoring a replica from its peer failed: " + e.message);
  Stats::Get().server_to_server.fetch_add(bytes);
  Stats::Get().restores.fetch_add(1);
  return Status::Ok();
}

// Rolls every replica of g back to the checkpoint in its own session, when the group holds
// exactly the checkpoint's objects: each replica's per-chunk digests are compared with the
// checkpoint's, and only the chunks that differ are written back. Cheaper than fresh sessions
// by a context, its modules and every byte of the checkpoint. Chunks on which the replicas
// disagree with each other (corrupt memory, or a flipped digest) count as mismatches.
Status FaultTolerance::RollbackInPlace(GroupSession* g) {
  if (g->creates_ != g->ckpt_creates_)
    return Status(Code::kUnimplemented, "objects were created or destroyed since the checkpoint");
  // An event the checkpoint had never seen signalled, or a user event set since, would stay
  // complete here and let replayed commands run before what they waited for.
  if (g->signals_ != g->ckpt_signals_) return Status(Code::kUnimplemented, "events were signalled for the first time");
  for (const LogEntry& e : log_)
    if (e.group == g && e.opcode == static_cast<uint16_t>(ir::Opcode::kUserEventSet))
      return Status(Code::kUnimplemented, "a user event was set since the checkpoint");
  const auto devices = Devices(g);
  for (SessionImpl* s : g->replicas_) TANDEM_RETURN_IF_ERROR(Quiesce(s, devices));
  GatherErrors(g);  // before the write-back's own errors
  const size_t n = g->replicas_.size();
  uint64_t written = 0;
  for (const auto& [key, region] : ckpt_[g]) {
    std::vector<std::vector<uint64_t>> now(n);
    for (size_t i = 0; i < n; ++i) {
      auto rep = g->replicas_[i]->Call(ir::BufferDigestReq{.stream = 0, .buffer = key.first, .offset = key.second,
                                                           .size = region.size, .chunk = kChunk, .wait = {}, .signal = 0});
      if (!rep.ok()) return rep.status();
      now[i] = std::move(rep->digests);
    }
    for (size_t c = 0; c < region.chunks.size(); ++c) {
      auto at = [&](size_t i) {
        return 2 * c + 1 < now[i].size() ? std::pair<uint64_t, uint64_t>{now[i][2 * c], now[i][2 * c + 1]} : std::pair<uint64_t, uint64_t>{0, 0};
      };
      bool disagree = false;
      for (size_t i = 1; i < n; ++i) disagree |= at(i) != at(0);
      if (disagree) Stats::Get().mismatches.fetch_add(1);
      for (size_t i = 0; i < n; ++i) {
        if (at(i) == region.digests[c]) continue;
        const auto& bytes = *region.chunks[c];
        g->replicas_[i]->Post(ir::BufferWriteReq{.stream = 0, .buffer = key.first, .offset = key.second + c * kChunk,
                                                 .size = bytes.size(), .data = bytes, .remote = {}, .wait = {},
                                                 .signal = 0});
        written += bytes.size();
      }
    }
  }
  // On the default streams: in place before any replayed command on another stream reads them.
  for (SessionImpl* s : g->replicas_) {
    TANDEM_RETURN_IF_ERROR(Quiesce(s, devices));
    for (const auto& e : s->TakeAsyncErrors())
      if (e.opcode == static_cast<uint32_t>(ir::Opcode::kBufferWrite))
        return Status(Code::kInternal, "writing the checkpoint back failed: " + e.message);
    s->ft_errors = 0;  // at the checkpoint again: the replay's errors are numbered from 0
  }
  Stats::Get().rollbacks_in_place.fetch_add(n);
  log::Debug("fault tolerance: {} rolled back in place ({} bytes written)", g->name_, written);
  return Status::Ok();
}

void FaultTolerance::RollbackAll(const std::string& why) {
  const auto start = Clock::now();
  log::Warn("fault tolerance: {}: every replica rolls back to the checkpoint and replays {} commands", why, log_.size());
  for (auto& g : groups_) touched_.insert(g.get());
  Stats::Get().rollbacks.fetch_add(1);
  // Answers still coming from the replicas' sessions are of the state being dropped: every open
  // op is issued again, by the replay or by ReissueOpen.
  {
    std::lock_guard<std::mutex> l(tasks_mu_);
    for (auto& [id, op] : open_) {
      std::lock_guard<std::mutex> lo(op->m);
      ++op->issue;
    }
  }
  static const bool fresh_only = std::getenv("TANDEM_TEST_FRESH_ROLLBACK") != nullptr;
  // A mismatch right after an in-place rollback may live where that restores nothing (a
  // corrupt module image, a device's state outside memory): the retry rebuilds everything.
  const bool in_place = !fresh_only && mismatch_streak_ <= 1;
  for (auto& g : groups_) {
    if (!g->failed_.ok()) continue;
    if (in_place) {
      Status st = RollbackInPlace(g.get());
      if (st.ok()) continue;
      log::Debug("fault tolerance: {} cannot roll back in place ({}): fresh sessions", g->name_, st.message());
    }
    // By session, not by index: a replica that cannot be restored may be dropped from the
    // list, and every other one must still be brought back to the checkpoint before the
    // replay (one left as it was would run the log twice).
    const std::vector<SessionImpl*> before = g->replicas_;
    for (SessionImpl* s : before) {
      const size_t i = g->IndexOf(s);
      if (i >= g->replicas_.size()) continue;
      Status st = RestoreFresh(g.get(), i, g->addresses_[i], /*replay_log=*/false);
      if (!st.ok()) {
        log::Error("fault tolerance: cannot restore {}: {}", g->addresses_[i], st.message());
        ReplaceLost(g.get(), i, st.message(), /*from_checkpoint=*/true);
      }
    }
  }
  for (auto& g : groups_)
    for (SessionImpl* s : g->replicas_) s->set_forward_output(false);  // replayed kernels print once
  // One replay for all groups, in the original order across them.
  uint64_t replayed = 0;
  for (const LogEntry& e : log_) {
    if (!e.group->failed_.ok()) continue;
    if (e.op) {
      bool open;
      {
        std::lock_guard<std::mutex> l(e.op->m);
        open = !e.op->delivered;
      }
      if (open) {  // answered by the replay: issued where it stood
        Issue(e.op);
        continue;
      }
      if (e.opcode == static_cast<uint16_t>(ir::Opcode::kBufferRead)) continue;
    }
    for (SessionImpl* s : e.group->replicas_) s->PostRaw(e.opcode, e.payload, nullptr);
    ++replayed;
  }
  for (auto& g : groups_) {
    const auto devices = Devices(g.get());
    for (SessionImpl* s : g->replicas_) {
      s->set_forward_output(false);
      Quiesce(s, devices);
    }
    GatherErrors(g.get());  // of the replay: only those the rolled-back state had not reported are new
    if (!g->replicas_.empty()) g->replicas_[0]->set_forward_output(true);
  }
  Stats::Get().replayed.fetch_add(replayed);
  Stats::Get().rollback_ns.fetch_add(static_cast<uint64_t>(std::chrono::nanoseconds(Clock::now() - start).count()));
}

void FaultTolerance::ReplaceLost(GroupSession* g, size_t i, const std::string& why, bool from_checkpoint) {
  const auto start = Clock::now();
  touched_.insert(g);
  log::Warn("fault tolerance: replica {} of {} ({}) is lost: {}", i, g->name_, g->addresses_[i], why);
  while (!spares_.empty()) {
    const std::string spare = spares_.front();
    spares_.pop_front();
    // A survivor holds the current state: copy it over. Otherwise (and inside a rollback,
    // whose survivors may not be restored yet) the checkpoint, and the log unless the
    // rollback replays it.
    size_t survivor = g->replicas_.size();
    for (size_t j = 0; j < g->replicas_.size() && !from_checkpoint; ++j)
      if (j != i && g->replicas_[j]->health().ok()) survivor = j;
    Status st;
    if (survivor < g->replicas_.size()) {
      auto opened = OpenSpare(spare);
      st = opened.status();
      if (st.ok()) {
        SessionImpl* s = opened.value();
        s->set_forward_output(false);
        Recreate(s, g->creates_, g->signals_);
        SessionImpl* old = g->replicas_[i];
        const std::string old_address = g->addresses_[i];
        g->replicas_[i] = s;
        g->addresses_[i] = spare;
        g->outvoted_[i] = 0;
        st = CopyFromPeer(g, i, survivor);
        s->TakeAsyncErrors();
        if (!st.ok() && !g->replicas_[survivor]->health().ok()) {
          // The survivor was lost during the copy, not the spare: the spare is used again,
          // restored from the checkpoint and the log (no survivor is left to copy).
          log::Warn("fault tolerance: {} was lost while {} copied from it: {} is restored from the checkpoint instead",
                    g->addresses_[survivor], spare, spare);
          g->replicas_[i] = old;
          g->addresses_[i] = old_address;
          source_->Retire(s);
          spares_.push_front(spare);
          continue;
        }
        if (i == 0) {
          // The survivor answers as primary from now on; the new replica votes.
          std::swap(g->replicas_[0], g->replicas_[survivor]);
          std::swap(g->addresses_[0], g->addresses_[survivor]);
          g->replicas_[0]->set_forward_output(true);
        }
        source_->Retire(old);
      }
    } else {
      st = RestoreFresh(g, i, spare, /*replay_log=*/!from_checkpoint);
    }
    if (st.ok()) {
      log::Warn("fault tolerance: {} took over as replica {} of {} in {:.3f} s", spare, i, g->name_,
                Seconds(Clock::now() - start));
      Stats::Get().migrations.fetch_add(1);
      Stats::Get().migration_ns.fetch_add(static_cast<uint64_t>(std::chrono::nanoseconds(Clock::now() - start).count()));
      PrepareStandby();
      return;
    }
    log::Error("fault tolerance: spare {} failed: {}", spare, st.message());
  }
  // No spare left: with a survivor the group goes on with fewer replicas.
  if (g->replicas_.size() > 1) {
    source_->Retire(g->replicas_[i]);
    g->replicas_.erase(g->replicas_.begin() + static_cast<long>(i));
    g->addresses_.erase(g->addresses_.begin() + static_cast<long>(i));
    g->outvoted_.erase(g->outvoted_.begin() + static_cast<long>(i));
    g->replicas_[0]->set_forward_output(true);
    log::Error("fault tolerance: no spare server left (TANDEM_SPARE_SERVERS): {} goes on with {} replica(s)",
               g->name_, g->replicas_.size());
    return;
  }
  FailGroup(g, Status(Code::kServerLost, "server " + g->addresses_[i] + " was lost (" + why +
                                             ") and no spare server is left (TANDEM_SPARE_SERVERS)"));
}

void FaultTolerance::FailGroup(GroupSession* g, const Status& why) {
  log::Error("fault tolerance: {}", why.message());
  g->failed_ = why;
  std::vector<std::shared_ptr<Op>> open;
  {
    std::lock_guard<std::mutex> l(tasks_mu_);
    for (auto& [id, op] : open_)
      if (op->group == g) open.push_back(op);
  }
  for (auto& op : open) Deliver(op, why, {});
}

void FaultTolerance::OnMismatch(const std::shared_ptr<Op>& op, std::vector<size_t> outvoted, bool majority) {
  GroupSession* g = op->group;
  Stats::Get().mismatches.fetch_add(1);
  if (majority) {
    // N >= 3: only the outvoted replicas are restored, from one that won.
    size_t good = 0;
    while (std::find(outvoted.begin(), outvoted.end(), good) != outvoted.end()) ++good;
    if (good >= g->replicas_.size()) return;
    // By session: ReplaceLost may drop an entry, and the indices after it move.
    SessionImpl* winner = g->replicas_[good];
    std::vector<SessionImpl*> losers;
    for (size_t bad : outvoted)
      if (bad < g->replicas_.size()) losers.push_back(g->replicas_[bad]);
    for (SessionImpl* loser : losers) {
      const size_t bad = g->IndexOf(loser), from = g->IndexOf(winner);
      if (bad >= g->replicas_.size() || from >= g->replicas_.size()) continue;
      if (++g->outvoted_[bad] >= config_.max_retries && !spares_.empty()) {
        ReplaceLost(g, bad, "outvoted " + std::to_string(g->outvoted_[bad]) + " times in a row");
        continue;
      }
      Status st = CopyFromPeer(g, bad, from);
      if (!st.ok()) ReplaceLost(g, bad, st.message());
    }
    return;
  }
  if (++mismatch_streak_ > config_.max_retries) {
    if (g->replicas_.size() == 2 && !spares_.empty()) {
      // A third voter finds the bad replica.
      const std::string spare = spares_.front();
      spares_.pop_front();
      log::Warn("fault tolerance: {} mismatches in a row on {}: {} joins as a third voter", mismatch_streak_, g->name_,
                spare);
      Status st = RestoreFresh(g, 2, spare, /*replay_log=*/true);
      if (!st.ok()) log::Error("fault tolerance: third voter {} failed: {}", spare, st.message());
      PrepareStandby();
      mismatch_streak_ = 0;
      return;  // ReissueOpen asks again, now with three voters
    }
    // Every replica disagrees even after rollbacks: the program itself is nondeterministic.
    ir::BufferReadReq read;
    (void)ir::DecodeRequest(op->payload, &read);
    std::string kernel = "none";
    for (auto it = log_.rbegin(); it != log_.rend(); ++it) {
      if (it->group != g || it->opcode != static_cast<uint16_t>(ir::Opcode::kLaunch)) continue;
      const uint64_t fn = FirstU64(it->payload, 8);  // LaunchReq: stream, function, ...
      for (const auto& [opcode, payload] : g->creates_) {
        ir::FunctionGetReq get;
        if (opcode == static_cast<uint16_t>(ir::Opcode::kFunctionGet) && ir::DecodeRequest(payload, &get).ok() &&
            get.function == fn)
          kernel = get.name;
      }
      break;
    }
    mismatch_streak_ = 0;
    Deliver(op, Status(Code::kInternal, "the replicas of " + g->name_ + " keep disagreeing on buffer " +
                                            std::to_string(read.buffer) + " [" + std::to_string(read.offset) + ", +" +
                                            std::to_string(read.size) + ") after " + std::to_string(config_.max_retries) +
                                            " rollbacks: the result is nondeterministic (last kernel: " + kernel + ")"),
            {});
    return;
  }
  RollbackAll("replicas of " + g->name_ + " disagree on a read back");
}

}  // namespace tandem::client
