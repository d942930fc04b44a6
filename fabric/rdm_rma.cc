// Memory registration and one-sided RMA, in chunks with a window in flight: a transfer of
// any size needs no memory beyond its registered buffers and a few contexts.
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "rdm_endpoint.h"
#include "tandem/log.h"

namespace tandem::fabric {
namespace {

constexpr size_t kWindow = 4;  // chunks in flight per operation

class RdmRegion final : public MemoryRegion {
 public:
  RdmRegion(std::shared_ptr<Handles> h, fid_mr* mr, void* base, size_t len, uint64_t remote_addr)
      : h_(std::move(h)), mr_(mr), base_(base), len_(len), remote_addr_(remote_addr) {}
  ~RdmRegion() override {
    RegionChange change(*h_);
    CloseFid(&mr_->fid, "memory region");
  }

  uint64_t remote_addr() const override { return remote_addr_; }
  uint64_t key() const override { return fi_mr_key(mr_); }
  void* base() const override { return base_; }
  size_t length() const override { return len_; }
  void* desc() const { return fi_mr_desc(mr_); }

 private:
  std::shared_ptr<Handles> h_;  // the domain outlives its regions
  fid_mr* mr_;
  void* base_;
  size_t len_;
  uint64_t remote_addr_;
};

}  // namespace

Result<std::unique_ptr<MemoryRegion>> RdmEndpoint::Register(void* addr, size_t len, uint32_t access) {
  if (addr == nullptr || len == 0) return Status::Invalid("fabric: cannot register an empty region");
  // Local use (as the source or target of our own RMA) is always allowed; remote as asked.
  uint64_t flags = FI_READ | FI_WRITE;
  if (access & kRemoteRead) flags |= FI_REMOTE_READ;
  if (access & kRemoteWrite) flags |= FI_REMOTE_WRITE;
  RegionChange change(*h_);  // a peer's RMA may be checked against the key map meanwhile
  auto mr = RegisterRaw(addr, len, flags);
  if (!mr.ok()) return mr.status();
  if (fi_mr_key(*mr) == FI_KEY_NOTAVAIL) {
    CloseFid(&(*mr)->fid, "memory region");
    return Status(Code::kUnimplemented, "fabric: " + provider_ + " uses raw memory keys, which Tandem does not");
  }
  // Peers address byte 0 by its virtual address (FI_MR_VIRT_ADDR) or as offset 0.
  uint64_t remote_addr = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(addr) : 0;
  return std::unique_ptr<MemoryRegion>(new RdmRegion(h_, *mr, addr, len, remote_addr));
}

Result<OpId> RdmEndpoint::PostRead(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                                   uint64_t remote_offset, size_t len) {
  return PostRma(false, peer, local, local_offset, remote, remote_offset, len);
}

Result<OpId> RdmEndpoint::PostWrite(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                                    uint64_t remote_offset, size_t len) {
  return PostRma(true, peer, local, local_offset, remote, remote_offset, len);
}

Result<OpId> RdmEndpoint::PostRma(bool write, PeerId peer, MemoryRegion& local, size_t local_offset,
                                  const RemoteRegion& remote, uint64_t remote_offset, size_t len) {
  auto* region = dynamic_cast<RdmRegion*>(&local);
  if (region == nullptr) return Status::Invalid("fabric: region was not registered by a fabric endpoint");
  if (local_offset > region->length() || len > region->length() - local_offset) {
    return Status::Invalid("fabric: RMA of " + std::to_string(len) + " bytes at " + std::to_string(local_offset) +
                           " overruns the local region of " + std::to_string(region->length()));
  }
  if (remote_offset > remote.len || len > remote.len - remote_offset) {
    return Status::Invalid("fabric: RMA of " + std::to_string(len) + " bytes at " + std::to_string(remote_offset) +
                           " overruns the remote region of " + std::to_string(remote.len));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Conn* c = FindConn(peer);
  if (c == nullptr) return Status::Unknown("fabric: no peer " + std::to_string(peer));
  if (c->state != Conn::State::kUp) return c->failure.ok() ? Status(Code::kLinkLost, "fabric: peer not connected") : c->failure;
  auto op = std::make_unique<RmaOp>();
  op->id = next_op_++;
  op->peer = peer;
  op->addr = c->addr;
  op->write = write;
  op->local = static_cast<uint8_t*>(region->base()) + local_offset;
  op->desc = region->desc();
  op->remote_addr = remote.addr + remote_offset;
  op->key = remote.key;
  op->len = len;
  for (size_t i = 0; i < kWindow; ++i) {
    op->chunks.push_back(std::make_unique<RmaChunk>());
    op->chunks.back()->op = op.get();
    op->idle.push_back(op->chunks.back().get());
  }
  OpId id = op->id;
  RmaOp& ref = *op;
  rma_ops_[id] = std::move(op);
  Pump(ref);
  return id;
}

void RdmEndpoint::Pump(RmaOp& op) {
  // Keep the window full; a busy provider leaves the rest to the progress thread.
  bool stalled = false;
  while (op.error.ok() && op.next < op.len && !op.idle.empty()) {
    RmaChunk* chunk = op.idle.back();
    chunk->len = std::min(rma_chunk_, op.len - op.next);
    iovec iov{op.local + op.next, chunk->len};
    fi_rma_iov rma{op.remote_addr + op.next, chunk->len, op.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &op.desc;
    msg.iov_count = 1;
    msg.addr = op.addr;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &chunk->fi;
    // A write completes only once the target has it, so Wait() means "the data is there".
    ssize_t r = InProvider(*h_, [&] {
      return op.write ? fi_writemsg(h_->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                      : fi_readmsg(h_->ep, &msg, FI_COMPLETION);
    });
    if (r == -FI_EAGAIN) {
      stalled = true;
      break;
    }
    if (r != 0) {
      op.error = FiError(Code::kLinkLost, op.write ? "fabric: fi_writemsg" : "fabric: fi_readmsg", static_cast<int>(r));
      break;
    }
    op.idle.pop_back();
    op.next += chunk->len;
    ++op.in_flight;
  }
  if (stalled) {
    rma_stalled_.insert(&op);
    deferred_ = true;
    Kick();
  } else {
    rma_stalled_.erase(&op);
  }
  FinishIfDone(op);
}

void RdmEndpoint::OnRmaDone(RmaChunk* chunk, Status status) {
  RmaOp& op = *chunk->op;
  --op.in_flight;
  op.idle.push_back(chunk);
  if (!status.ok() && op.error.ok()) op.error = status;
  Pump(op);
}

void RdmEndpoint::FinishIfDone(RmaOp& op) {
  if (!op.finished() && op.error.ok()) return;
  cv_.notify_all();
  // A released operation goes once nothing of it is left with the provider.
  if (op.released && op.in_flight == 0) {
    rma_stalled_.erase(&op);
    rma_ops_.erase(op.id);
  }
}

Status RdmEndpoint::Wait(OpId id, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = rma_ops_.find(id);
  if (it == rma_ops_.end() || it->second->released) return Status::Invalid("fabric: unknown RMA op " + std::to_string(id));
  RmaOp* op = it->second.get();
  bool ended = cv_.wait_for(lock, timeout, [&] { return op->finished() || !op->error.ok(); });
  if (!ended) {
    return Status(Code::kTimeout, "fabric: RMA op " + std::to_string(id) + " not complete within " +
                                      std::to_string(timeout.count()) + " ms");
  }
  Status st = op->error;
  op->released = true;
  FinishIfDone(*op);
  return st;
}

bool RdmEndpoint::InFlight(OpId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rma_ops_.find(id);
  return it != rma_ops_.end() && (it->second->in_flight > 0 || (!it->second->released && !it->second->finished()));
}

}  // namespace tandem::fabric
