// BulkIO over fabric RMA: a few registered staging chunks, allocated once per session, with
// the RMA of the next chunks in flight while the backend copies the current one, so a copy
// of any size needs only kSlots * kChunk bytes of buffers.
#pragma once

#include <array>
#include <functional>
#include <memory>

#include "tandem/fabric/fabric.h"
#include "tandem/server/backend.h"

namespace tandem::server {

class FabricBulk : public BulkIO {
 public:
  static constexpr size_t kChunk = 4u << 20;
  static constexpr size_t kSlots = 4;

  // Where the staging chunks come from (Backend::BulkStaging); null, or a failure: the
  // chunks are ordinary memory of this object's own.
  using StagingAlloc = std::function<Result<std::shared_ptr<HostBuffer>>(size_t)>;

  FabricBulk(fabric::Endpoint* endpoint, fabric::PeerId peer, fabric::Millis op_timeout, StagingAlloc alloc = nullptr);
  ~FabricBulk() override;

  Status Pull(const ir::Region& remote, size_t len,
              const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) override;
  Status Push(const ir::Region& remote, size_t len,
              const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) override;

 private:
  Status Prepare(const ir::Region& remote, size_t len);
  uint8_t* slot(size_t chunk) const { return staging_ + (chunk % kSlots) * kChunk; }
  // Waits for every RMA still posted, so no late completion lands in a reused chunk.
  Status Drain(std::array<fabric::OpId, kSlots>& ops, std::array<bool, kSlots>& posted);
  // A failed or timed-out wait leaves the operation's fate unknown: it marks the bulk broken.
  Status WaitOp(fabric::OpId op);

  fabric::Endpoint* endpoint_;
  fabric::PeerId peer_;
  fabric::Millis op_timeout_;
  StagingAlloc alloc_;
  std::shared_ptr<HostBuffer> host_;  // the backend's staging memory, when it gave some
  uint8_t* own_ = nullptr;            // else this
  uint8_t* staging_ = nullptr;
  std::unique_ptr<fabric::MemoryRegion> region_;
  // After a transfer that could not be drained, the staging chunks may still be written by
  // the network: no later transfer may use them.
  bool broken_ = false;
};

}  // namespace tandem::server
