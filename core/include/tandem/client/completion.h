// A one-shot completion a blocking caller waits on while the thread routing replies sets it
// (the runtime's receiver, or the caller itself reading for its reply). Owned by shared_ptr,
// one held by the reply's callback: Set() may still be unlocking when Wait() has returned.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "tandem/status.h"

namespace tandem::client {

class Completion {
 public:
  // `fields`: the reply's fields after its head, kept for the waiter.
  void Set(const Status& st, std::span<const uint8_t> fields = {}) {
    std::lock_guard<std::mutex> l(m_);
    status_ = st;
    fields_.assign(fields.begin(), fields.end());
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  // Waits for Set(); the time spent counts as waiting on the network in TANDEM_STATS.
  Status Wait();
  // The reply's fields, once Wait() returned.
  std::vector<uint8_t>& fields() { return fields_; }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  Status status_;
  std::vector<uint8_t> fields_;
};

}  // namespace tandem::client
