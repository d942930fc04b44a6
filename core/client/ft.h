// Fault tolerance, once for both APIs, on the IR: redundant execution with voting,
// checkpoint and replay, migration to spare servers.
//
// A virtual device is a group of TANDEM_REDUNDANCY replicas (sessions on different servers)
// that receive the same command stream (GroupSession, a Session the front ends use like any
// other). Every state-changing command (ir::kLogged) enters one log, ordered across all
// groups, with the host data it carried (under fault tolerance transfers travel inline, so
// the data is in the command). Read backs are voted: one replica (two with N >= 3) sends the
// bytes, the others an XXH3-128 digest computed on their server.
//
// Checkpoints are coordinated: every TANDEM_CHECKPOINT_PERIOD seconds, at the next read
// back, every group is synchronised, the replicas' per-chunk digests of every allocation are
// compared, the chunks that changed since the last checkpoint are read from one replica and
// kept here, on the client (as DS-CUDA does; restoring then crosses the client's link), and
// the log is dropped. A restored replica is a fresh session: the objects alive at the
// checkpoint are created again (CUDA memory at the same addresses), the checkpoint written,
// the log replayed.
//
// Recovery runs on one thread of its own while program threads wait:
//  - a mismatch with N = 2 (or without a majority): every replica of every group is rolled
//    back to the checkpoint and the log replayed; TANDEM_MAX_RETRIES mismatches in a row
//    bring in a spare as a third voter; all different then means the program itself is
//    nondeterministic, reported as such;
//  - with N >= 3 the majority's bytes are returned and only the outvoted replica is
//    restored, by server-to-server copies from a good one;
//  - a lost replica (link error, or no answer within TANDEM_FAILOVER_TIMEOUT_MS) is replaced
//    by a server from TANDEM_SPARE_SERVERS: from a surviving replica by server-to-server
//    copies, or from the checkpoint and the log. No spare left: the group fails with a
//    clear error (the API's device-lost error).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "session.h"

namespace tandem::client {

struct FtConfig {
  int redundancy = 1;                 // TANDEM_REDUNDANCY
  std::vector<std::string> spares;    // TANDEM_SPARE_SERVERS
  Clock::duration checkpoint_period;  // TANDEM_CHECKPOINT_PERIOD (seconds, default 10)
  size_t log_limit = 256u << 20;      // TANDEM_LOG_LIMIT (bytes; K/M/G suffixes)
  int max_retries = 3;                // TANDEM_MAX_RETRIES
  bool enabled() const { return redundancy > 1 || !spares.empty(); }
  static FtConfig FromEnv();
};

// What fault tolerance needs from the runtime.
class SessionSource {
 public:
  virtual ~SessionSource() = default;
  // A new session (a new worker) on the server at `address`.
  virtual Result<SessionImpl*> Open(const std::string& address) = 0;
  // Ends a session fault tolerance no longer uses (goodbye when it is healthy).
  virtual void Retire(SessionImpl* s) = 0;
};

class FaultTolerance;

// One virtual device group as the front ends see it.
class GroupSession final : public Session {
 public:
  GroupSession(FaultTolerance* ft, std::vector<SessionImpl*> replicas, std::vector<std::string> addresses);

  const std::string& server() const override { return name_; }
  const std::string& backend() const override { return backend_; }
  const std::string& worker_address() const override;
  uint64_t PostRaw(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) override;
  Status Flush() override;
  Status CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) override;
  Result<std::unique_ptr<fabric::MemoryRegion>> Register(const void*, size_t, uint32_t) override {
    return Status(Code::kUnimplemented, "no RMA under fault tolerance: transfers travel in the logged commands");
  }
  bool rma() const override { return false; }
  std::vector<ir::AsyncError> TakeAsyncErrors() override;
  Status health() const override;

 private:
  friend class FaultTolerance;
  // Where `s` is in replicas_ (replicas_.size() when it is not a member): recovery steps that
  // may drop or swap replicas find theirs again by session.
  size_t IndexOf(const SessionImpl* s) const {
    return static_cast<size_t>(std::find(replicas_.begin(), replicas_.end(), s) - replicas_.begin());
  }
  FaultTolerance* ft_;
  std::string name_, backend_;
  // Guarded by the FaultTolerance lock.
  std::vector<SessionImpl*> replicas_;  // [0] is the primary
  std::vector<std::string> addresses_;
  std::vector<int> outvoted_;           // per replica, mismatches it lost in a row
  // Objects alive now, in creation order (create commands and their configuration), and
  // as they were at the last checkpoint.
  std::vector<std::pair<uint16_t, std::vector<uint8_t>>> creates_, ckpt_creates_;
  // Modules the program freed whose creates stay while a live ModuleLink or ModuleCompile in
  // creates_ names them as an input or header: replaying that needs them.
  std::set<uint64_t> freed_kept_;
  // Events that commands signalled and nobody destroyed (a restore makes them exist again).
  std::set<uint64_t> signals_, ckpt_signals_;
  // Module globals the program asked for (ModuleGlobal's payload), with the address and size
  // every replica agreed on: checkpointed and restored like allocations.
  std::map<std::vector<uint8_t>, std::pair<uint64_t, uint64_t>> globals_;
  // Deferred errors of the group's commands the program has not taken yet, in order: kept
  // here, not in a replica's session, so that a recovery that replaces, restores or rolls
  // back sessions cannot lose them (FaultTolerance::GatherErrors).
  std::vector<ir::AsyncError> held_errors_;
  // How many errors of the commands since the checkpoint are known (taken by the program, or
  // held): the primary's errors past that number are new.
  uint64_t errors_known_ = 0;
  Status failed_;
};

class FaultTolerance {
 public:
  FaultTolerance(FtConfig config, SessionSource* source);
  ~FaultTolerance();
  GroupSession* AddGroup(std::vector<SessionImpl*> replicas, std::vector<std::string> addresses);
  // The next spare, taken from the pool ("" when none is left): for a server that is already
  // unreachable when the program starts.
  std::string TakeSpare();
  // Starts opening a session on the next spare in the background (once the program's own
  // sessions are up), so a takeover does not wait for the spare's worker to start.
  void StartStandby();
  // At exit: waits (at most `max`) for a standby still being opened, so that it is among the
  // sessions that say goodbye instead of a worker left waiting for its client.
  void SettleStandby(std::chrono::milliseconds max);
  // A session reported lost (SessionImpl's lost hook).
  void OnSessionLost(SessionImpl* s);

 private:
  friend class GroupSession;
  struct Op;
  struct LogEntry {
    GroupSession* group;
    uint16_t opcode;
    std::vector<uint8_t> payload;
    std::shared_ptr<Op> op;  // a logged command with a reply: the replay may answer it
  };
  // Where a region lives: (buffer, 0) for an allocation, (0, address) for a module global.
  using RegionKey = std::pair<uint64_t, uint64_t>;
  struct Region {             // one allocation's or module global's content at the last checkpoint
    uint64_t size = 0;
    std::vector<std::pair<uint64_t, uint64_t>> digests;  // per kChunk
    // Shared with the previous checkpoint where a chunk did not change: a checkpoint that
    // fails half way leaves the last complete one intact.
    std::vector<std::shared_ptr<const std::vector<uint8_t>>> chunks;
  };

  uint64_t Post(GroupSession* g, uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn);
  // Sends an op to its group's replicas (lock held).
  void Issue(const std::shared_ptr<Op>& op);
  void OnAnswer(const std::shared_ptr<Op>& op, uint64_t issue, size_t replica, const Status& st,
                std::span<const uint8_t> fields);
  void Evaluate(const std::shared_ptr<Op>& op, uint64_t issue);
  // Whether op's answers of `issue` are still the ones that count (not delivered, not issued again).
  bool Current(const std::shared_ptr<Op>& op, uint64_t issue);
  void Deliver(const std::shared_ptr<Op>& op, const Status& st, std::span<const uint8_t> fields);
  void NoteCreate(GroupSession* g, uint16_t opcode, const std::vector<uint8_t>& payload);
  // Keeps unset_user_events_ (lock held).
  void NoteUserEvent(uint16_t opcode, const std::vector<uint8_t>& payload);

  // Recovery (the recovery thread, lock held).
  void Schedule(std::function<void()> task);
  void RecoveryLoop();
  void ReissueOpen();
  // The ops still waiting for an answer (of g only, when given): a snapshot, since Deliver
  // erases from open_ where replies are routed.
  std::vector<std::shared_ptr<Op>> OpenOps(const GroupSession* g = nullptr);
  // Open ops that wait only for lost replicas, issued again to the healthy ones (lock held).
  void ReissueStranded();
  Status Checkpoint();
  void RollbackAll(const std::string& why);
  Status RestoreFresh(GroupSession* g, size_t i, const std::string& address, bool replay_log);
  Status RollbackInPlace(GroupSession* g);
  Status CopyFromPeer(GroupSession* g, size_t bad, size_t good);
  // A spare takes replica i's place: a copy of a healthy survivor (or the checkpoint and the
  // log when there is none); with from_checkpoint (inside a rollback, whose replay follows)
  // the checkpoint alone. No spare left: the group goes on without it, or fails.
  void ReplaceLost(GroupSession* g, size_t i, const std::string& why, bool from_checkpoint = false);
  void OnMismatch(const std::shared_ptr<Op>& op, std::vector<size_t> outvoted, bool majority);
  void FailGroup(GroupSession* g, const Status& why);
  std::vector<uint64_t> Devices(const GroupSession* g) const;
  // What a checkpoint saves of g: its allocations and module globals, with their sizes. Asks
  // the replicas where a global they have not placed yet lives.
  std::vector<std::pair<RegionKey, uint64_t>> Regions(GroupSession* g);
  // Takes the deferred errors of g's replicas (of `only`, when given) into each one's list
  // since the checkpoint (SessionImpl::ft_errors), then moves the primary's past
  // g->errors_known_ into g->held_errors_: the program sees the primary's errors, each once,
  // as it sees the primary's answers; another replica's differ only when it is faulty, and
  // then its state is what voting repairs. Replicas run the same commands and so report the
  // same errors in the same order, some sooner: a replica that becomes primary (a copy of a
  // peer, a restore) brings the errors the lost one had not received. A session restored
  // from the checkpoint lists from 0 again, so errors its replay reports anew are dropped.
  // primary_settled: the primary has finished every command sent so far (see the .cc).
  // Internal commands of a recovery (restores, copies) must have their errors taken before
  // the next gather.
  void GatherErrors(GroupSession* g, SessionImpl* only = nullptr, bool primary_settled = false);
  // Waits for every command posted so far on `s` to finish (their deferred errors come with
  // its answer: GatherErrors takes them).
  Status Quiesce(SessionImpl* s, const std::vector<uint64_t>& devices);
  // A session on `address` for a takeover: the standby when it was opened there (waiting
  // for it if it is still being opened), else a new one. Lock held.
  Result<SessionImpl*> OpenSpare(const std::string& address);
  // Opens a session on spares_.front() in the background, unless one is there already. Lock held.
  void PrepareStandby();

  const FtConfig config_;
  SessionSource* source_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool recovering_ = false;
  // User events the program created and has not set or destroyed. A stream they hold keeps
  // a DeviceSync (Quiesce) waiting until the program sets them, which it cannot do while a
  // checkpoint or a recovery holds mu_: checkpoints are put off while any is unset, and a
  // recovery waits a while for them first (cv_ is notified when the last one goes).
  std::set<uint64_t> unset_user_events_;
  bool told_deferred_ = false;  // the deferred checkpoint was logged once
  std::vector<std::unique_ptr<GroupSession>> groups_;
  std::deque<std::string> spares_;
  // The session opened ahead of need on a spare (PrepareStandby): set by its own thread.
  struct Standby {
    std::string address;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    Result<SessionImpl*> session{Status(Code::kInternal, "not opened yet")};
  };
  std::shared_ptr<Standby> standby_;
  std::deque<LogEntry> log_;
  size_t log_bytes_ = 0;
  std::map<const GroupSession*, std::map<RegionKey, Region>> ckpt_;
  Clock::time_point last_ckpt_ = Clock::now();
  bool have_ckpt_ = false;  // the first read back takes one: rollbacks need not replay from the start
  std::map<uint64_t, std::shared_ptr<Op>> open_;  // ops waiting for answers, by id; under tasks_mu_
  uint64_t next_op_ = 1;
  std::atomic<int> mismatch_streak_{0};
  uint64_t generation_ = 0;                   // one per recovery
  std::set<const GroupSession*> touched_;     // groups the current recovery changed

  std::mutex tasks_mu_;
  std::condition_variable tasks_cv_;
  std::deque<std::function<void()>> tasks_;
  std::thread thread_;
};

}  // namespace tandem::client
