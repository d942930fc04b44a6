// Replies that wait on the device (Backend::ReplyLater), run off the session's executor and
// sent once ready, in an order the client can rely on. The worker owns one per session; it
// is transport-free so the tests drive the same code.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "tandem/ir/codec.h"
#include "tandem/server/backend.h"
#include "tandem/status.h"

namespace tandem::server {

// One reply the executor handed over (Session's BatchOutcome::late).
struct LateReply {
  DeferredWait wait;
  // The reply's bytes once `wait` has returned `done`, carrying `errors`.
  std::function<std::vector<uint8_t>(const Status& done, std::vector<ir::AsyncError> errors)> reply;
  // The deferred errors of the commands before it, taken when it was handed over: it is
  // their sync point.
  std::vector<ir::AsyncError> errors;
  // Handed over while some enqueued command might wait for a user event or another server
  // (!Backend::EnqueuedCompleteAlone): its wait may end only after a later command of the
  // session's has been answered.
  bool may_block = false;

  // Waits, then builds the reply with its own errors: for callers that run replies one by
  // one in order (the worker before its waiter starts, tests).
  std::vector<uint8_t> operator()() {
    const Status done = wait();
    return reply(done, std::move(errors));
  }
};

// Runs late replies and sends them:
// - Replies handed over while everything enqueued can complete alone run one after another,
//   in order, on one thread (tdm-waiter), which spins briefly before it sleeps.
// - A reply that may block (LateReply::may_block) runs on a side thread (tdm-wait-ue) that
//   has nothing else to do, so the replies after it go on: a program's other thread may set
//   the user event only once its own clFinish has returned. Side threads start when replies
//   are queued for them and none is idle, up to kMaxSideThreads (a bound on what one session
//   may cost the host, not a count a program is expected to reach: each read through host
//   memory behind a user event holds one until its device copy ends); kKeptSideThreads of
//   them stay for the session's life, the others end after kSideThreadIdle without work.
//   With all of them blocked on user events, the next such reply waits for one of them, and
//   so do the replies after it whose order it decides.
// - A reply leaves once every earlier reply whose device work is done (DeferredWait::done)
//   has left: its completion may imply theirs (a read's bytes must be there before a later
//   wait on its queue returns), while work not done yet cannot be implied by it.
// - A reply carries the errors of every earlier reply not sent yet, so errors reach the
//   client in order and before any later sync; those replies then leave without them.
class LateReplies {
 public:
  using Send = std::function<void(std::vector<uint8_t>)>;
  // Spins until `ready` is set or the worker's spin window has passed (the waiter's look for
  // work before it sleeps); null: no spin.
  using Spin = std::function<void(const std::atomic<bool>& ready)>;

  static constexpr size_t kMaxSideThreads = 4096;
  static constexpr size_t kKeptSideThreads = 16;
  static constexpr std::chrono::milliseconds kSideThreadIdle{500};

  explicit LateReplies(Send send, Spin spin = nullptr);
  // Starts the in-order thread (detached: a wait on a user event that is never set must not
  // hold the process at exit, which the worker ends by _exit).
  void Start();
  // Replies of one batch, in order. From the executor only.
  void Push(std::vector<LateReply> late);
  // Nothing queued, running or unsent. Exact for the thread that pushes: only it adds work.
  bool Idle() const { return pending_.load() == 0; }

 private:
  struct Entry {
    uint64_t index = 0;  // order of hand-over
    LateReply late;
    bool cleared = false;  // its place among the sends is taken (ticket)
  };
  void Loop();
  void SideLoop();
  void Run(const std::shared_ptr<Entry>& e, bool side);
  // Under mu_: an earlier reply whose work is done has not taken its place among the sends.
  bool EarlierGoesFirst(const Entry& e) const;

  Send send_;
  Spin spin_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // queue_ has work
  std::condition_variable order_cv_;  // a reply cleared or left
  std::deque<std::shared_ptr<Entry>> queue_;  // for the in-order thread
  std::condition_variable side_cv_;           // side_queue_ has work
  std::deque<std::shared_ptr<Entry>> side_queue_;  // replies that may block, for the side threads
  size_t side_threads_ = 0;                   // started
  size_t side_idle_ = 0;                      // of those, not running a reply
  bool start_failure_logged_ = false;         // a side thread could not start (logged once)
  std::atomic<bool> side_ready_{false};       // side_queue_ may not be empty: ends a side spin
  std::atomic<bool> side_spinning_{false};    // an idle side thread spins (one at most)
  std::deque<std::shared_ptr<Entry>> open_;   // handed over and not sent, by index
  uint64_t next_index_ = 0;
  uint64_t next_ticket_ = 0;  // sends leave in ticket order
  uint64_t serving_ = 0;      // the ticket whose send is next
  std::atomic<bool> ready_{false};  // queue_ may not be empty: ends the spin (cleared under mu_)
  std::atomic<size_t> pending_{0};  // pushed and not yet sent
};

}  // namespace tandem::server
