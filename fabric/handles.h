// The libfabric objects of one endpoint, closed in dependency order when the last owner goes:
// memory regions keep them alive, so a region may outlive the Endpoint that registered it.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <shared_mutex>
#include <string>
#include <utility>

#include "tandem/status.h"

namespace tandem::fabric {

struct Handles {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;

  // Held shared around every provider call that may run the provider's progress (a CQ read,
  // a post: net runs progress over every socket in a post to a peer not yet connected), and
  // exclusively while a memory region opens or closes (RegionChange). Progress checks the key
  // of each incoming RMA against the domain's map; libfabric 1.17's net provider changes that
  // map on fi_close of a region under no lock of its own (its domain lock is OFI_LOCK_NONE),
  // which corrupted it (SIGSEGV in ofi_mr_map_verify, ft.linkcut in CI, 2026-11-27).
  // Only for that provider (`net`, and `tcp` alone, its name from 1.18 on): the others lock
  // their maps, and ran for weeks of CI without it.
  bool exclude_regions = false;
  std::shared_mutex provider_mu;
  std::atomic<int> region_changes{0};  // RegionChanges waiting or under way: CQ readers step aside
  bool can_block = false;              // the CQ has a wait object (fi_cq_sread / fi_cq_signal work)

  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles();
};

// Holds h.provider_mu exclusively for opening or closing a memory region; CQ readers step
// aside and a blocking read is woken, so the wait is for provider calls under way.
class RegionChange {
 public:
  explicit RegionChange(Handles& h);
  ~RegionChange();
  RegionChange(const RegionChange&) = delete;
  RegionChange& operator=(const RegionChange&) = delete;

 private:
  Handles& h_;
};

// A provider call that may run its progress: f() with h.provider_mu held shared.
template <class F>
auto InProvider(Handles& h, F&& f) {
  if (!h.exclude_regions) return std::forward<F>(f)();
  std::shared_lock<std::shared_mutex> lock(h.provider_mu);
  return std::forward<F>(f)();
}

// "what: <fi_strerror>" as a Status of the given code.
Status FiError(Code code, const std::string& what, int fi_ret);
// Closes a fid, logging (not ignoring) a failure.
void CloseFid(fid* f, const char* what);

}  // namespace tandem::fabric
