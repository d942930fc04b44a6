#include "tandem/server/late_replies.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::server {

LateReplies::LateReplies(Send send, Spin spin) : send_(std::move(send)), spin_(std::move(spin)) {}

void LateReplies::Start() {
  std::thread([this] {
    NameThisThread("tdm-waiter");
    Loop();
  }).detach();
}

void LateReplies::Push(std::vector<LateReply> late) {
  size_t spawn = 0;
  size_t side = 0;  // replies queued for the side threads
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (LateReply& l : late) {
      auto e = std::make_shared<Entry>();
      e->index = next_index_++;
      e->late = std::move(l);
      open_.push_back(e);
      pending_.fetch_add(1);
      side += e->late.may_block ? 1 : 0;
      if (e->late.may_block)
        side_queue_.push_back(std::move(e));
      else
        queue_.push_back(std::move(e));
    }
    if (side_queue_.size() > side_idle_ && side_threads_ < kMaxSideThreads) {
      spawn = std::min(side_queue_.size() - side_idle_, kMaxSideThreads - side_threads_);
      side_threads_ += spawn;
      side_idle_ += spawn;  // counted as idle until they take work
    }
  }
  // As many side threads as replies were queued for them at once, up to kMaxSideThreads;
  // past kKeptSideThreads they end once idle (SideLoop).
  for (size_t i = 0; i < spawn; ++i) {
    try {
      std::thread([this] {
        NameThisThread("tdm-wait-ue");
        SideLoop();
      }).detach();
    } catch (const std::system_error& err) {
      std::lock_guard<std::mutex> lock(mu_);
      side_threads_ -= spawn - i;
      side_idle_ -= spawn - i;
      if (!start_failure_logged_) {  // once: a session at the host's thread limit would log each push
        start_failure_logged_ = true;
        log::Error("late replies: cannot start a thread ({}); {} run replies that may wait for a user event "
                   "(the host's thread limit bounds them, not kMaxSideThreads)",
                   err.what(),
                   side_threads_ ? fmt::format("{} side threads", side_threads_) : std::string("the in-order thread"));
      }
      if (side_threads_ == 0) {  // nothing else would run them: in order, by index, with the rest
        for (auto& e : side_queue_) queue_.push_back(std::move(e));
        side_queue_.clear();
        std::ranges::sort(queue_, {}, [](const std::shared_ptr<Entry>& e) { return e->index; });
      }
      break;
    }
  }
  if (side) {
    side_ready_.store(true, std::memory_order_release);
    // One wake-up per reply: a burst may have left hundreds of threads idle.
    for (size_t i = 0; i < side; ++i) side_cv_.notify_one();
  }
  // After the lock: a spinning waiter that saw the flag inside it would block on the mutex,
  // and its wake-up would cost this thread a system call. The flag only ends its spin.
  ready_.store(true, std::memory_order_release);
  cv_.notify_one();
}

// One idle side thread at a time spins for work as the in-order thread does (a session with a
// user event or a gate sends every reply this way), the others sleep. Past kKeptSideThreads
// (a burst of replies blocked at once), an idle thread ends after kSideThreadIdle.
void LateReplies::SideLoop() {
  for (;;) {
    std::shared_ptr<Entry> next;
    if (spin_ && !side_spinning_.exchange(true)) {
      spin_(side_ready_);
      side_spinning_.store(false);
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Whether to end is decided at the deadline, against the count then: the threads of a
      // burst all come back while it is high, and only those past kKeptSideThreads may go.
      const auto until = std::chrono::steady_clock::now() + kSideThreadIdle;
      while (side_queue_.empty()) {
        if (side_threads_ <= kKeptSideThreads) {
          side_cv_.wait(lock);
        } else if (side_cv_.wait_until(lock, until) == std::cv_status::timeout && side_queue_.empty() &&
                   side_threads_ > kKeptSideThreads) {
          --side_threads_;
          --side_idle_;
          return;
        }
      }
      next = std::move(side_queue_.front());
      side_queue_.pop_front();
      side_ready_.store(!side_queue_.empty(), std::memory_order_relaxed);
      --side_idle_;
    }
    Run(next, true);
  }
}

void LateReplies::Loop() {
  for (;;) {
    std::shared_ptr<Entry> next;
    if (spin_) spin_(ready_);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty(); });
      next = std::move(queue_.front());
      queue_.pop_front();
      ready_.store(!queue_.empty(), std::memory_order_relaxed);
    }
    Run(next, false);
  }
}

bool LateReplies::EarlierGoesFirst(const Entry& e) const {
  for (const std::shared_ptr<Entry>& o : open_) {
    if (o->index >= e.index) break;
    if (!o->cleared && (!o->late.wait.done || o->late.wait.done())) return true;
  }
  return false;
}

void LateReplies::Run(const std::shared_ptr<Entry>& e, bool side) {
  const Status done = e->late.wait();
  std::vector<ir::AsyncError> errors;
  uint64_t ticket = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // An earlier reply whose work is done is on its way (its wait returns without blocking):
    // this one waits for it. One whose work is not done cannot be implied by this one's.
    order_cv_.wait(lock, [&] { return !EarlierGoesFirst(*e); });
    for (const std::shared_ptr<Entry>& o : open_) {
      if (o->index > e->index) break;
      std::move(o->late.errors.begin(), o->late.errors.end(), std::back_inserter(errors));
      o->late.errors.clear();
    }
    e->cleared = true;
    ticket = next_ticket_++;
  }
  order_cv_.notify_all();
  // Built outside the lock (a read's bytes may be many): the executor pushes meanwhile.
  std::vector<uint8_t> bytes = e->late.reply(done, std::move(errors));
  {
    std::unique_lock<std::mutex> lock(mu_);
    order_cv_.wait(lock, [&] { return serving_ == ticket; });
  }
  send_(std::move(bytes));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++serving_;
    open_.erase(std::find(open_.begin(), open_.end(), e));
    if (side) ++side_idle_;  // before Idle() can say so: the next push finds this thread
  }
  pending_.fetch_sub(1);
  order_cv_.notify_all();
}

}  // namespace tandem::server
