#include "range_allocator.h"

#include <iterator>

namespace tandem::cuda {

RangeAllocator::RangeAllocator(uint64_t base, uint64_t size) { free_.emplace(base, size); }

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t size, uint64_t alignment) {
  if (size == 0) return std::nullopt;  // a zero-sized block would alias the next one
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t start = it->first, len = it->second;
    const uint64_t aligned = (start + alignment - 1) & ~(alignment - 1);
    if (aligned - start + size > len) continue;
    // Split the free block into what is left before and after the allocation.
    free_.erase(it);
    if (aligned > start) free_.emplace(start, aligned - start);
    if (aligned + size < start + len) free_.emplace(aligned + size, start + len - aligned - size);
    used_ += size;
    return aligned;
  }
  return std::nullopt;
}

void RangeAllocator::Free(uint64_t address, uint64_t size) {
  used_ -= size;
  auto next = free_.lower_bound(address);
  // Merge with the free block that ends where this one starts, and the one that follows.
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == address) {
      address = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && address + size == next->first) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(address, size);
}

}  // namespace tandem::cuda
