// Fault tolerance, the posting half: configuration, the group session the program talks to,
// and how each command reaches the replicas, is logged and voted on. Recoveries are in
// ft_recovery.cc.
#include <algorithm>
#include <cstdlib>
#include <optional>

#include "ft_internal.h"
#include "stats.h"
#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::client {
namespace {

using namespace ft_internal;

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

// Creation commands: kept (with their configuration) while their object lives.
bool IsCreate(ir::Opcode op) {
  switch (op) {
    case ir::Opcode::kAddressReserve:
    case ir::Opcode::kBufferAlloc:
    case ir::Opcode::kModuleLoad:
    case ir::Opcode::kModuleBuild:
    case ir::Opcode::kModuleCompile:  // a create of its module, like a build
    case ir::Opcode::kModuleLink:     // creates its module from others (see NoteCreate)
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

// Whether a create names module `h` as a link input or compile header.
bool Uses(const std::pair<uint16_t, std::vector<uint8_t>>& create, uint64_t h) {
  const auto op = static_cast<ir::Opcode>(create.first);
  if (op == ir::Opcode::kModuleLink) {
    ir::ModuleLinkReq req;
    return ir::DecodeRequest(create.second, &req).ok() && std::find(req.inputs.begin(), req.inputs.end(), h) != req.inputs.end();
  }
  if (op == ir::Opcode::kModuleCompile) {
    ir::ModuleCompileReq req;
    return ir::DecodeRequest(create.second, &req).ok() && std::find(req.headers.begin(), req.headers.end(), h) != req.headers.end();
  }
  return false;
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
  thread_ = std::thread([this] { NameThisThread("tdm-recovery"); RecoveryLoop(); });
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
    NameThisThread("tdm-standby");
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
    // Handles are unique across kinds: everything created under this one goes, unless a live
    // link or compile was made from it (OpenCL programs are often released right after).
    // Then it goes once the last of those goes.
    auto forget = [&](uint64_t handle) {
      std::erase_if(g->creates_, [&](const auto& c) {
        const auto cop = static_cast<ir::Opcode>(c.first);
        return cop != ir::Opcode::kAddressReserve && FirstU64(c.second) == handle;
      });
    };
    auto used = [&](uint64_t handle) {
      return std::any_of(g->creates_.begin(), g->creates_.end(), [&](const auto& c) { return Uses(c, handle); });
    };
    const uint64_t handle = FirstU64(payload);
    if (op == ir::Opcode::kModuleFree && used(handle)) {
      g->freed_kept_.insert(handle);
      return;
    }
    forget(handle);
    for (bool again = true; again;) {
      again = false;
      for (uint64_t kept : g->freed_kept_) {
        if (used(kept)) continue;
        forget(kept);
        g->freed_kept_.erase(kept);
        again = true;
        break;
      }
    }
  }
}

uint64_t FaultTolerance::Post(GroupSession* g, uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) {
  const ir::CommandInfo* info = ir::FindCommand(opcode);
  const uint32_t flags = info ? info->flags : 0;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !recovering_; });
  // Before the failed group's early answer: a user event set or destroyed there is no longer
  // one that checkpoints and recoveries must wait for.
  NoteUserEvent(opcode, payload);
  if (!g->failed_.ok()) {
    Status why = g->failed_;
    lock.unlock();
    if (fn) fn(why, {});
    return 0;
  }
  const bool read = opcode == static_cast<uint16_t>(ir::Opcode::kBufferRead) && fn;
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
    // Deliver erases from the thread routing replies, which need not hold mu_.
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
    // Reads and logged commands go to every replica, a query to the primary only; a replica
    // already lost (closed, awaiting its replacement) is passed over while another is healthy:
    // it would only answer "lost", and a query or read the recovery must wait for could keep
    // the program from setting a user event the recovery waits for (RecoveryLoop). What a
    // lost replica misses, its replacement gets from a peer's copy or the log.
    const bool all = op->read || op->logged || !op->fn;
    for (size_t i = 0; i < n && (all || targets.empty()); ++i)
      if (g->replicas_[i]->health().ok()) targets.push_back(i);
    if (targets.empty()) targets.push_back(0);  // answers "lost" at once; the recovery re-issues it
    if (op->read)
      for (size_t k = 0; k < std::min<size_t>(n >= 3 ? 2 : 1, targets.size()); ++k) op->carries_data[targets[k]] = true;
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
      payload = ir::Encode(ir::BufferDigestReq{.stream = read.stream, .buffer = read.buffer, .offset = read.offset,
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

// All answers of an issue are in (where replies are routed, or inline from a post to a lost
// session).
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

}  // namespace tandem::client
