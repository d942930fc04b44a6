// The libfabric objects of one endpoint, closed in dependency order when the last owner goes:
// memory regions keep them alive, so a region may outlive the Endpoint that registered it.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

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

  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles();
};

// "what: <fi_strerror>" as a Status of the given code.
Status FiError(Code code, const std::string& what, int fi_ret);
// Closes a fid, logging (not ignoring) a failure.
void CloseFid(fid* f, const char* what);

}  // namespace tandem::fabric
