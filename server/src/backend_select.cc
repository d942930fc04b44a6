#include <fmt/format.h>

#include "tandem/log.h"
#include "tandemd.h"

namespace tandem::server {

Result<std::unique_ptr<Backend>> OpenBackend(const std::string& kind, const BackendOptions& options,
                                             std::string* chosen) {
  if (kind == "cuda" || kind == "auto") {
    auto cuda = MakeCudaBackend(options);
    if (cuda.ok() && cuda.value()->device_count() > 0) {
      *chosen = "cuda";
      return std::move(cuda.value());
    }
    if (kind == "cuda")
      return cuda.ok() ? Status(Code::kInvalidArgument, "the CUDA backend has no device") : cuda.status();
    log::Info("backend auto: CUDA unusable ({}), trying OpenCL",
              cuda.ok() ? "no device" : cuda.status().message());
  }
  if (kind == "opencl" || kind == "auto") {
    *chosen = "opencl";
    return MakeOpenCLBackend(options);
  }
  return Status::Invalid(fmt::format("unknown backend '{}' (opencl, cuda or auto)", kind));
}

}  // namespace tandem::server
