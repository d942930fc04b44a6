// A one-shot completion a blocking caller waits on while the receiver thread sets it.
#pragma once

#include <condition_variable>
#include <mutex>

#include "tandem/status.h"

namespace tandem::client {

class Completion {
 public:
  void Set(const Status& st) {
    std::lock_guard<std::mutex> l(m_);
    status_ = st;
    done_ = true;
    cv_.notify_all();
  }
  // Waits for Set(); the time spent counts as waiting on the network in TANDEM_STATS.
  Status Wait();

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace tandem::client
