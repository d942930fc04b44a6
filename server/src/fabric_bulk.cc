#include "fabric_bulk.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "tandem/log.h"

namespace tandem::server {

FabricBulk::FabricBulk(fabric::Endpoint* endpoint, fabric::PeerId peer, fabric::Millis op_timeout, StagingAlloc alloc)
    : endpoint_(endpoint), peer_(peer), op_timeout_(op_timeout), alloc_(std::move(alloc)) {}

FabricBulk::~FabricBulk() {
  region_.reset();  // deregister before the memory goes
  host_.reset();
  std::free(own_);
}

// Checks the request against the client's region and registers the staging chunks once.
Status FabricBulk::Prepare(const ir::Region& remote, size_t len) {
  if (broken_) return Status(Code::kLinkLost, "an earlier bulk transfer of this session could not be completed");
  if (len > remote.len)
    return Status::Invalid(fmt::format("transfer of {} bytes exceeds the client region of {} bytes", len, remote.len));
  if (region_) return Status::Ok();
  // Allocated once; a failed registration below keeps it for the next attempt.
  if (!staging_ && alloc_) {
    auto host = alloc_(kSlots * kChunk);
    if (host.ok() && host.value()->size() >= kSlots * kChunk) {
      host_ = std::move(host.value());
      staging_ = host_->data();
    } else if (host.ok()) {
      log::Warn("bulk staging: the backend gave {} bytes of {}; using ordinary memory", host.value()->size(),
                kSlots * kChunk);
    } else if (host.status().code() != Code::kUnimplemented) {
      log::Warn("bulk staging: the backend's memory failed ({}); using ordinary memory", host.status().message());
    }
  }
  if (!staging_) staging_ = own_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kSlots * kChunk));
  if (!staging_) return Status(Code::kOutOfMemory, "cannot allocate the bulk staging chunks");
  auto mr = endpoint_->Register(staging_, kSlots * kChunk, fabric::kLocal);
  if (!mr.ok()) return mr.status();
  region_ = std::move(mr.value());
  return Status::Ok();
}

Status FabricBulk::Drain(std::array<fabric::OpId, kSlots>& ops, std::array<bool, kSlots>& posted) {
  Status first;
  for (size_t s = 0; s < kSlots; ++s) {
    if (!posted[s]) continue;
    posted[s] = false;
    Status st = WaitOp(ops[s]);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status FabricBulk::WaitOp(fabric::OpId op) {
  Status st = endpoint_->Wait(op, op_timeout_);
  if (!st.ok()) broken_ = true;
  return st;
}

Status FabricBulk::Pull(const ir::Region& remote, size_t len,
                        const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) {
  TANDEM_RETURN_IF_ERROR(Prepare(remote, len));
  const fabric::RemoteRegion rr{remote.addr, remote.len, remote.key};
  const size_t chunks = (len + kChunk - 1) / kChunk;
  std::array<fabric::OpId, kSlots> ops{};
  std::array<bool, kSlots> posted{};
  auto post = [&](size_t c) -> Status {
    const size_t off = c * kChunk, n = std::min(kChunk, len - off);
    auto op = endpoint_->PostRead(peer_, *region_, (c % kSlots) * kChunk, rr, off, n);
    if (!op.ok()) return op.status();
    ops[c % kSlots] = op.value();
    posted[c % kSlots] = true;
    return Status::Ok();
  };
  // Keep kSlots reads in flight: chunk c+kSlots is fetched into c's slot once c is consumed.
  Status st;
  for (size_t c = 0; c < std::min(chunks, kSlots) && st.ok(); ++c) st = post(c);
  for (size_t c = 0; c < chunks && st.ok(); ++c) {
    posted[c % kSlots] = false;
    st = WaitOp(ops[c % kSlots]);
    if (!st.ok()) break;
    const size_t off = c * kChunk;
    st = sink(slot(c), off, std::min(kChunk, len - off));
    if (st.ok() && c + kSlots < chunks) st = post(c + kSlots);
  }
  Status drained = Drain(ops, posted);
  return st.ok() ? drained : st;
}

Status FabricBulk::Push(const ir::Region& remote, size_t len,
                        const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) {
  TANDEM_RETURN_IF_ERROR(Prepare(remote, len));
  const fabric::RemoteRegion rr{remote.addr, remote.len, remote.key};
  const size_t chunks = (len + kChunk - 1) / kChunk;
  std::array<fabric::OpId, kSlots> ops{};
  std::array<bool, kSlots> posted{};
  Status st;
  // Fill chunk c while the writes of the previous kSlots-1 chunks are on the wire.
  for (size_t c = 0; c < chunks && st.ok(); ++c) {
    const size_t s = c % kSlots, off = c * kChunk, n = std::min(kChunk, len - off);
    if (posted[s]) {
      posted[s] = false;
      st = WaitOp(ops[s]);
      if (!st.ok()) break;
    }
    st = source(slot(c), off, n);
    if (!st.ok()) break;
    auto op = endpoint_->PostWrite(peer_, *region_, s * kChunk, rr, off, n);
    if (!op.ok()) {
      st = op.status();
      break;
    }
    ops[s] = op.value();
    posted[s] = true;
  }
  // The reply must not overtake the data: every write completes before Push returns.
  Status drained = Drain(ops, posted);
  return st.ok() ? drained : st;
}

}  // namespace tandem::server
