// The libfabric objects of one endpoint, closed in dependency order when the last owner goes:
// memory regions keep them alive, so a region may outlive the Endpoint that registered it.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <mutex>
#include <string>

#include "tandem/status.h"

namespace tandem::fabric {

struct Handles {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;

  // Held by whoever reads the CQ (RdmEndpoint's progress thread, or a caller in Next()) and
  // by whoever opens or closes a memory region (RegionChange). A provider looks up the key of
  // each incoming RMA inside that read; libfabric 1.17's net provider changes the same map on
  // fi_close of a region under no lock of its own (its domain lock is OFI_LOCK_NONE), which
  // corrupted it (SIGSEGV in ofi_mr_map_verify, ft.linkcut in CI, 2026-11-27). Recursive: a
  // completion dispatched under it may free a registered buffer.
  std::recursive_mutex cq_mu;
  std::atomic<int> region_changes{0};  // threads waiting for cq_mu to change regions: readers step aside
  bool can_block = false;              // the CQ has a wait object (fi_cq_sread / fi_cq_signal work)

  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles();
};

// Holds h.cq_mu for opening or closing a memory region: CQ readers step aside and a blocking
// read is woken, so the wait is a CQ read at most.
class RegionChange {
 public:
  explicit RegionChange(Handles& h);
  ~RegionChange();
  RegionChange(const RegionChange&) = delete;
  RegionChange& operator=(const RegionChange&) = delete;

 private:
  Handles& h_;
};

// "what: <fi_strerror>" as a Status of the given code.
Status FiError(Code code, const std::string& what, int fi_ret);
// Closes a fid, logging (not ignoring) a failure.
void CloseFid(fid* f, const char* what);

}  // namespace tandem::fabric
