// Internal to the fault-tolerance code (ft.cc: posting and voting; ft_recovery.cc:
// checkpoints and recoveries): the helpers and the one record both halves use.
#pragma once

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <span>

#include "ft.h"

namespace tandem::client {
namespace ft_internal {

inline bool IsLinkLoss(const Status& st) { return st.code() == Code::kLinkLost || st.code() == Code::kServerLost; }

inline uint64_t FirstU64(const std::vector<uint8_t>& p, size_t at = 0) {
  uint64_t v = 0;
  if (p.size() >= at + 8) std::memcpy(&v, p.data() + at, 8);
  return v;
}

using Digest = std::pair<uint64_t, uint64_t>;

inline Digest Hash(std::span<const uint8_t> data) {
  const XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return {h.low64, h.high64};
}

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace ft_internal

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

}  // namespace tandem::client
