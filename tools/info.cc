// `tandem info`: the servers of TANDEM_SERVERS (or --servers) and their devices, one line
// per device, like `clinfo -l` or `nvidia-smi -L`.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "tandem/client/runtime.h"
#include "tandem_tool.h"

namespace tandem::tool {
namespace {

std::string ApiNames(uint32_t mask) {
  std::string out;
  if (mask & static_cast<uint32_t>(Api::kCuda)) out += "CUDA";
  if (mask & static_cast<uint32_t>(Api::kOpenCL)) out += out.empty() ? "OpenCL" : ", OpenCL";
  return out.empty() ? "none" : out;
}

// tandemd reports "opencl (Portable Computing Language)": print "opencl, Portable ...".
std::string BackendLabel(const std::string& backend) {
  size_t open = backend.find(" (");
  if (open == std::string::npos || backend.back() != ')') return backend;
  return backend.substr(0, open) + ", " + backend.substr(open + 2, backend.size() - open - 3);
}

}  // namespace

int Info(const std::optional<std::string>& servers) {
  // The runtime reads TANDEM_SERVERS when it first starts.
  if (servers) setenv("TANDEM_SERVERS", servers->c_str(), 1);
  const char* list = std::getenv("TANDEM_SERVERS");
  if (!list || !*list) {
    std::fprintf(stderr, "tandem info: no servers: pass --servers host:port[,...] or set TANDEM_SERVERS\n");
    return 2;
  }
  client::Runtime& rt = client::Runtime::Get();
  auto all = static_cast<Api>(static_cast<uint32_t>(Api::kOpenCL) | static_cast<uint32_t>(Api::kCuda));
  std::vector<client::Device*> devices = rt.Devices(all);

  int missing = 0;
  for (const std::string& entry : client::ParseServerList(list)) {
    client::ServerSpec spec;
    const std::string server = client::ParseServerSpec(entry, &spec) ? spec.address : entry;
    bool any = false;
    std::set<const client::Session*> seen;
    for (client::Device* d : devices) {
      if (d->session->server() != server || seen.count(d->session)) continue;
      seen.insert(d->session);
      any = true;
      for (client::Device* e : devices) {
        if (e->session != d->session) continue;
        std::printf("server %s (backend %s): device %u: %s [%s]\n", server.c_str(), BackendLabel(e->session->backend()).c_str(),
                    e->remote_index, e->info.name.c_str(), ApiNames(e->info.api).c_str());
      }
    }
    if (!any) {
      std::printf("server %s: no devices (unreachable or empty)\n", server.c_str());
      ++missing;
    }
  }
  if (!rt.status().ok()) {
    std::fprintf(stderr, "tandem info: %s\n", rt.status().message().c_str());
    return 1;
  }
  std::fflush(stdout);
  rt.Shutdown();
  return missing ? 1 : 0;
}

}  // namespace tandem::tool
