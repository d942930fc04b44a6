// One peer's messages put back together from their fragments and handed on in msg_id order.
// A header is the peer's word, and the peer may be anyone who reached the port (the fabric
// knows no token): memory grows with the bytes that actually came, never with what a header
// claims, and a peer that breaks the rules gets an error, upon which its link ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "tandem/status.h"
#include "wire.h"

namespace tandem::fabric {

class Reassembly {
 public:
  struct Limits {
    // Messages of several fragments begun and not complete: one per sending thread at a time
    // (a thread sends a message's fragments one after another). Whole messages waiting their
    // turn do not count: small frames from other threads may pile up behind a large message.
    size_t max_open = 4096;
    // How far past the next message to hand on a fragment's msg_id may lie.
    uint64_t max_ahead = uint64_t{1} << 20;
    // Bytes held for messages not yet handed on: what a peer can make this side hold.
    uint64_t max_held = wire::kMaxMessage;
  };

  Reassembly() = default;
  explicit Reassembly(Limits limits) : limits_(limits) {}

  // Takes one data fragment (its header already checked by wire::DecodeHeader: the payload
  // lies inside total_len) and appends to `out` every message now due, in order. A fragment
  // of a message already handed on is dropped (Ok). An error for: a fragment whose count or
  // total disagrees with its message's first one, one that overlaps or repeats another, all
  // fragments come but not covering the message, too many messages open, a msg_id too far
  // ahead, more bytes held than max_held, a single fragment shorter than its message. The
  // caller ends the link: what the peer sends next cannot be trusted either.
  Status Add(const wire::Header& h, const uint8_t* payload, size_t len, std::vector<std::vector<uint8_t>>* out);

  // Messages begun and not complete.
  size_t open() const { return incomplete_; }
  // Bytes held for messages not yet handed on.
  uint64_t held() const { return held_; }
  uint64_t next() const { return next_; }
  void Clear() {
    partial_.clear();
    held_ = 0;
    incomplete_ = 0;
  }

 private:
  struct Partial {
    uint64_t total = 0;
    uint32_t count = 0;
    uint32_t received = 0;
    std::vector<uint8_t> data;                           // [0, data.size()) came, in one piece
    std::map<uint64_t, std::vector<uint8_t>> later;      // fragments past it, by offset
    bool complete() const { return data.size() == total && later.empty(); }
  };
  // Moves fragments of `later` that now continue `data` into it.
  static void Absorb(Partial& p);

  Limits limits_;
  uint64_t next_ = 0;  // msg_id of the next message to hand on
  uint64_t held_ = 0;
  size_t incomplete_ = 0;
  std::map<uint64_t, Partial> partial_;  // by msg_id; complete ones wait here for their turn
};

}  // namespace tandem::fabric
