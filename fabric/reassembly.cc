#include "reassembly.h"

#include <fmt/format.h>

#include <cstring>
#include <iterator>
#include <utility>

namespace tandem::fabric {

void Reassembly::Absorb(Partial& p) {
  for (auto it = p.later.begin(); it != p.later.end() && it->first == p.data.size(); it = p.later.erase(it))
    p.data.insert(p.data.end(), it->second.begin(), it->second.end());
}

Status Reassembly::Add(const wire::Header& h, const uint8_t* payload, size_t len,
                       std::vector<std::vector<uint8_t>>* out) {
  if (h.msg_id < next_) return Status::Ok();  // a stale copy of a message handed on
  if (h.frag_count == 1 && (h.offset != 0 || len != h.total_len))
    return Status::Protocol(fmt::format("message {}: a single fragment of {} bytes at {} for {} bytes", h.msg_id, len,
                                        h.offset, h.total_len));
  // The common case: a whole message, next in order.
  if (h.frag_count == 1 && h.msg_id == next_ && partial_.empty()) {
    ++next_;
    out->emplace_back(payload, payload + len);
    return Status::Ok();
  }
  if (h.msg_id - next_ >= limits_.max_ahead)
    return Status::Protocol(fmt::format("message {} is {} ahead of the next one due", h.msg_id, h.msg_id - next_));
  if (len > limits_.max_held - held_)
    return Status::Protocol(fmt::format("more than {} bytes held for messages not yet complete or due", limits_.max_held));
  auto [it, fresh] = partial_.try_emplace(h.msg_id);
  Partial& p = it->second;
  if (fresh) {
    if (h.frag_count > 1 && incomplete_ >= limits_.max_open) {
      partial_.erase(it);
      return Status::Protocol(fmt::format("more than {} messages begun and not complete", limits_.max_open));
    }
    p.total = h.total_len;
    p.count = h.frag_count;
    ++incomplete_;
  } else if (p.count != h.frag_count || p.total != h.total_len) {
    return Status::Protocol(fmt::format("a fragment of message {} says {} fragments / {} bytes, its first {} / {}",
                                        h.msg_id, h.frag_count, h.total_len, p.count, p.total));
  }
  if (p.received == p.count)
    return Status::Protocol(fmt::format("message {} has more than its {} fragments", h.msg_id, p.count));
  // Placed by offset; a fragment that starts inside bytes already here, or where another
  // waits, overlaps or repeats one.
  if (h.offset < p.data.size() || (h.offset > p.data.size() && p.later.contains(h.offset)))
    return Status::Protocol(fmt::format("a fragment of message {} at offset {} overlaps another", h.msg_id, h.offset));
  if (h.offset == p.data.size()) {
    p.data.insert(p.data.end(), payload, payload + len);
    Absorb(p);
  } else {
    p.later.emplace(h.offset, std::vector<uint8_t>(payload, payload + len));
  }
  ++p.received;
  held_ += len;
  if (p.received == p.count) {
    if (!p.complete())
      return Status::Protocol(fmt::format("the {} fragments of message {} do not make up its {} bytes", p.count,
                                          h.msg_id, p.total));
    --incomplete_;
  }
  // Hand on every complete message whose turn it is.
  for (auto d = partial_.begin(); d != partial_.end() && d->first == next_ && d->second.received == d->second.count &&
                                  d->second.complete();
       d = partial_.erase(d)) {
    ++next_;
    held_ -= d->second.data.size();
    out->push_back(std::move(d->second.data));
  }
  return Status::Ok();
}

}  // namespace tandem::fabric
