// First-fit allocator of a numeric range with coalescing free list: the device address
// space of a virtual device, and the inside of each chunk that small allocations share.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace tandem::cuda {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t base, uint64_t size);
  // An aligned block of `size` bytes (alignment: a power of two), or nothing if none is free.
  std::optional<uint64_t> Allocate(uint64_t size, uint64_t alignment);
  // Returns a block given out by Allocate with the same size.
  void Free(uint64_t address, uint64_t size);
  bool empty() const { return used_ == 0; }

 private:
  std::map<uint64_t, uint64_t> free_;  // start -> size, never adjacent
  uint64_t used_ = 0;
};

}  // namespace tandem::cuda
