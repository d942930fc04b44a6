// The provider-neutral parts of the interface: address parsing, provider choice, the
// blocking RMA conveniences, and the factory.
#include "tandem/fabric/fabric.h"

#include <cstdlib>

#include "rdm_endpoint.h"

namespace tandem::fabric {

Result<std::unique_ptr<Endpoint>> Endpoint::Open(const Options& options) { return RdmEndpoint::Open(options); }

Status Endpoint::Read(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                      uint64_t remote_offset, size_t len, Millis timeout) {
  auto op = PostRead(peer, local, local_offset, remote, remote_offset, len);
  if (!op.ok()) return op.status();
  return Wait(*op, timeout);
}

Status Endpoint::Write(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                       uint64_t remote_offset, size_t len, Millis timeout) {
  auto op = PostWrite(peer, local, local_offset, remote, remote_offset, len);
  if (!op.ok()) return op.status();
  return Wait(*op, timeout);
}

bool SplitHostPort(const std::string& host_port, std::string* host, std::string* port) {
  std::string h, p;
  if (!host_port.empty() && host_port[0] == '[') {
    // "[v6addr]:port"
    auto close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() || host_port[close + 1] != ':') return false;
    h = host_port.substr(1, close - 1);
    p = host_port.substr(close + 2);
  } else {
    auto colon = host_port.find(':');
    if (colon == std::string::npos || host_port.find(':', colon + 1) != std::string::npos) return false;
    h = host_port.substr(0, colon);
    p = host_port.substr(colon + 1);
  }
  if (h.empty() || p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  if (std::stoul(p) > 65535) return false;
  *host = h;
  *port = p;
  return true;
}

std::string ProviderFromEnv() {
  for (const char* var : {"TANDEM_FABRIC_PROVIDER", "FI_PROVIDER"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return v;
  }
  return "tcp";
}

}  // namespace tandem::fabric
