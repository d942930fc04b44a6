// The dlopen table of the driver API (see cuda_driver.h).
#include "cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

namespace tandem::server::cuda {
namespace {

using GetProcAddressFn = PFN_cuGetProcAddress_v12000;  // exported as cuGetProcAddress_v2
using DriverGetVersionFn = PFN_cuDriverGetVersion_v2020;

Status Missing(std::string_view what) {
  return Status(Code::kUnimplemented, fmt::format("the CUDA driver is unusable: {}", what));
}

// Resolves every entry point of the table through cuGetProcAddress: the version the table
// names (or the driver's own, if it is older: the entries keep their signature across those
// versions) and legacy-stream semantics (stream 0 is the legacy default stream, as the front
// end expects).
Status Resolve(GetProcAddressFn get, Driver* d) {
  auto one = [&](const char* name, int version, void** slot, bool required) -> Status {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get(name, slot, std::min(version, d->version), CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *slot) return Status::Ok();
    *slot = nullptr;
    if (!required) return Status::Ok();
    return Missing(fmt::format("driver {}.{} lacks {} (CUresult {}, query {})", d->version / 1000,
                               d->version % 1000 / 10, name, static_cast<int>(r), static_cast<int>(found)));
  };
#define TANDEM_CUDA_REQUIRED(fn, v) TANDEM_RETURN_IF_ERROR(one(#fn, v, reinterpret_cast<void**>(&d->fn), true));
#define TANDEM_CUDA_OPTIONAL(fn, v) TANDEM_RETURN_IF_ERROR(one(#fn, v, reinterpret_cast<void**>(&d->fn), false));
  TANDEM_CUDA_DRIVER_FUNCS(TANDEM_CUDA_REQUIRED, TANDEM_CUDA_OPTIONAL)
#undef TANDEM_CUDA_REQUIRED
#undef TANDEM_CUDA_OPTIONAL
  return Status::Ok();
}

Result<const Driver*> Load() {
  // RTLD_LOCAL: the driver's symbols stay out of the process's global namespace.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    return Missing(fmt::format("cannot open libcuda.so.1 ({})", why ? why : "no reason given"));
  }
  auto get = reinterpret_cast<GetProcAddressFn>(::dlsym(lib, "cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<DriverGetVersionFn>(::dlsym(lib, "cuDriverGetVersion"));
  if (!get || !get_version) return Missing("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
  static Driver driver;
  if (get_version(&driver.version) != CUDA_SUCCESS) return Missing("cuDriverGetVersion failed");
  TANDEM_RETURN_IF_ERROR(Resolve(get, &driver));
  TANDEM_RETURN_IF_ERROR(driver.Check(driver.cuInit(0), "cuInit"));
  return static_cast<const Driver*>(&driver);
}

}  // namespace

Status Driver::Check(CUresult r, std::string_view call) const {
  if (r == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "CUDA_ERROR_UNKNOWN_CODE";
  if (cuGetErrorString(r, &text) != CUDA_SUCCESS || !text) text = "no description";
  std::string msg = fmt::format("{}: {}: {}", call, name, text);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return Status(Code::kOutOfMemory, std::move(msg), r, Api::kCuda);
  return Status::Native(Api::kCuda, r, std::move(msg));
}

Result<const Driver*> LoadDriver() {
  // Loaded once: a second backend in the same process shares the table (and its failure).
  static std::once_flag once;
  static Result<const Driver*> loaded = Status(Code::kInternal, "the CUDA driver was not loaded");
  std::call_once(once, [] { loaded = Load(); });
  return loaded;
}

bool IsSticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
      return true;
    default:
      return false;
  }
}

}  // namespace tandem::server::cuda
