// Fault tolerance, the recovery half: coordinated checkpoints, and what a lost, outvoted or
// mismatching replica costs (restore from the checkpoint and replay the log, copy from a
// healthy peer, roll back in place, bring in a spare). Posting and voting are in ft.cc.
#include <algorithm>
#include <optional>

#include "ft_internal.h"
#include "stats.h"
#include "tandem/log.h"

namespace tandem::client {
namespace {

using namespace ft_internal;

constexpr uint64_t kChunk = 1u << 20;  // checkpoint granularity

// How long a recovery waits for the program to set its user events (RecoveryLoop).
constexpr auto kUserEventGrace = std::chrono::seconds(10);

// For messages: "buffer 7" or "the module global at 0x7f0000001000".
std::string RegionName(const std::pair<uint64_t, uint64_t>& key) {
  return key.first ? fmt::format("buffer {}", key.first) : fmt::format("the module global at {:#x}", key.second);
}

// Posts a logged command again. One the program asked an answer of (it has one by now) asks
// again and drops it: its failure then comes in that answer, as it first did, and not as a
// deferred error that GatherErrors would count as one more.
void Replay(SessionImpl* s, uint16_t opcode, const std::vector<uint8_t>& payload, bool had_answer) {
  RawReplyFn drop;
  if (had_answer) drop = [](const Status&, std::span<const uint8_t>) {};
  s->PostRaw(opcode, payload, std::move(drop));
}

// Posts to a fresh session the objects a replica had (`creates`, in creation order) and makes
// the events its commands had signalled (`signals`) exist again, complete.
void Recreate(SessionImpl* s, const std::vector<std::pair<uint16_t, std::vector<uint8_t>>>& creates,
              const std::set<uint64_t>& signals) {
  for (const auto& [opcode, payload] : creates) s->PostRaw(opcode, payload, nullptr);
  for (uint64_t e : signals) s->Post(ir::MarkerReq{.stream = 0, .barrier = 0, .wait = {}, .signal = e});
}

}  // namespace

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
      // What a thread waits for that a lost replica was to answer is asked of a healthy one
      // now: a callback thread's event query, say, which its user event waits on.
      log::Info("fault tolerance: the recovery waits for {} unset user event(s)", unset_user_events_.size());
      ReissueStranded();
      if (!cv_.wait_for(lock, kUserEventGrace, [&] { return unset_user_events_.empty(); }))
        log::Error("fault tolerance: {} user event(s) still unset after {} s: recovering anyway. A stream waiting "
                   "on one keeps the recovery, and the program, waiting: they cannot be set while it runs",
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

std::vector<std::shared_ptr<FaultTolerance::Op>> FaultTolerance::OpenOps(const GroupSession* g) {
  std::vector<std::shared_ptr<Op>> out;
  std::lock_guard<std::mutex> l(tasks_mu_);
  for (auto& [id, op] : open_)
    if (!g || op->group == g) out.push_back(op);
  return out;
}

// Open ops that wait only for lost replicas, issued again to the healthy ones (lock held).
void FaultTolerance::ReissueStranded() {
  for (auto& op : OpenOps()) {
    GroupSession* g = op->group;
    if (!g->failed_.ok()) continue;
    bool stranded = false;
    {
      std::lock_guard<std::mutex> l(op->m);
      // Logged commands went to every replica: a healthy one answers them, or the replay.
      if (op->delivered || (op->logged && !op->read) || op->waiting != 0) continue;
      // Every answer is in and none can be used: each one that counts (a read's data, any
      // other's reply) is a lost link. A read that a mismatch holds is not stranded.
      bool any = false;
      stranded = true;
      for (size_t i = 0; i < op->answers.size(); ++i) {
        const auto& a = op->answers[i];
        if (!a.in || (op->read && !op->carries_data[i])) continue;
        any = true;
        if (!IsLinkLoss(a.st)) stranded = false;
      }
      stranded &= any;
    }
    bool healthy = false;
    for (SessionImpl* s : g->replicas_) healthy |= s->health().ok();
    if (stranded && healthy) Issue(op);
  }
}

// Ops of the groups a recovery touched that still wait: asked again of the group as it is
// now, unless the recovery re-issued them itself (a replay). Logged ops are answered by
// their replay or by a surviving replica, never sent twice.
void FaultTolerance::ReissueOpen() {
  for (auto& op : OpenOps()) {
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

void FaultTolerance::GatherErrors(GroupSession* g, SessionImpl* only, bool primary_settled) {
  for (SessionImpl* s : g->replicas_) {
    if (only && s != only) continue;
    std::vector<ir::AsyncError> errors = s->TakeAsyncErrors();
    s->ft_errors.insert(s->ft_errors.end(), std::make_move_iterator(errors.begin()), std::make_move_iterator(errors.end()));
  }
  if (g->replicas_.empty()) return;
  const std::vector<ir::AsyncError>& primary = g->replicas_.front()->ft_errors;
  // A primary that has finished every command sent so far reports all it ever will of them:
  // fewer than the program was given means a replica it replaced reported errors of its own
  // (a faulty one), and the next real error is past this primary's count, not past theirs.
  if (primary_settled) g->errors_known_ = std::min<uint64_t>(g->errors_known_, primary.size());
  if (primary.size() <= g->errors_known_) return;
  g->held_errors_.insert(g->held_errors_.end(), primary.begin() + static_cast<long>(g->errors_known_), primary.end());
  g->errors_known_ = primary.size();
}

Status FaultTolerance::Quiesce(SessionImpl* s, const std::vector<uint64_t>& devices) {
  for (uint64_t d : devices) {
    std::vector<uint8_t> unused;
    Status st = s->CallRaw(static_cast<uint16_t>(ir::Opcode::kDeviceSync), ir::Encode(ir::DeviceSyncReq{.device = d}), &unused);
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
    for (SessionImpl* s : g->replicas_) s->ft_errors.clear();
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
  s->ft_errors.clear();
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
      Replay(s, e.opcode, e.payload, e.op != nullptr);
      ++replayed;
    }
  }
  Stats::Get().replayed.fetch_add(replayed);
  Status st = Quiesce(s, Devices(g));
  // The replay's errors: only those the lost state had not reported yet are new. A primary
  // that replayed the whole log has reported every error it will.
  GatherErrors(g, s, /*primary_settled=*/st.ok() && replay_log && i == 0);
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
  to->ft_errors = from->ft_errors;
  for (const auto& e : errors)
    if (e.opcode == static_cast<uint32_t>(ir::Opcode::kPeerRecv) || e.opcode == static_cast<uint32_t>(ir::Opcode::kPeerSend))
      return Status(Code::kInternal, "restoring a replica from its peer failed: " + e.message);
  // A primary copied from a peer that has finished everything: publish what the peer had that
  // the program was not given (an error in flight when the primary was lost).
  if (bad == 0) GatherErrors(g, from, /*primary_settled=*/true);
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
    s->ft_errors.clear();  // at the checkpoint again: the replay's errors are numbered from 0
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
    for (SessionImpl* s : e.group->replicas_) Replay(s, e.opcode, e.payload, e.op != nullptr);
    ++replayed;
  }
  for (auto& g : groups_) {
    const auto devices = Devices(g.get());
    for (SessionImpl* s : g->replicas_) {
      s->set_forward_output(false);
      Quiesce(s, devices);
    }
    // Of the replay: only those the rolled-back state had not reported are new; the primary has
    // finished the whole replay.
    GatherErrors(g.get(), nullptr, /*primary_settled=*/true);
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
  for (auto& op : OpenOps(g)) Deliver(op, why, {});
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
