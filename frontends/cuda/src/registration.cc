// The hidden entry points nvcc's generated code calls: fat binary, kernel and variable
// registration (from static constructors, so nothing here touches the network), and the
// launch configuration stack behind <<<...>>>. See ../shared/CUDA-ABI.md.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "frontend.h"

namespace tandem::cuda {
namespace {

// __fatBinC_Wrapper_t and the fat binary header it points to.
struct FatbinWrapper {
  uint32_t magic;
  uint32_t version;
  const void* data;
  const void* filename_or_fatbins;
};
struct FatbinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;
  uint64_t files_size;
};
constexpr uint32_t kWrapperMagic = 0x466243b1;
constexpr uint32_t kHeaderMagic = 0xBA55ED50;

struct CallConfig {
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
};
// <<<...>>> pushes, the stub pops: per thread, nested when arguments launch kernels.
thread_local std::vector<CallConfig> t_configs;

FatBinary* AsFatBinary(void** handle) { return reinterpret_cast<FatBinary*>(handle); }

}  // namespace

const Kernel* FindKernel(const void* p) {
  Frontend& f = Frontend::Get();
  if (auto it = f.kernels.find(p); it != f.kernels.end()) return it->second.get();
  const Kernel* k = static_cast<const Kernel*>(p);
  return f.kernel_set.contains(k) ? k : nullptr;
}

}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

// Keeps the image where nvcc put it; it is hashed and sent on first use of each device.
TANDEM_API void** __cudaRegisterFatBinary(void* fat_cubin) {
  Frontend& f = Frontend::Get();
  auto fb = std::make_unique<FatBinary>();
  const auto* wrapper = static_cast<const FatbinWrapper*>(fat_cubin);
  const auto* header = wrapper ? static_cast<const FatbinHeader*>(wrapper->data) : nullptr;
  if (!wrapper || wrapper->magic != kWrapperMagic || !header || header->magic != kHeaderMagic) {
    log::Error("__cudaRegisterFatBinary: not a CUDA fat binary (wrapper magic {:#x}); its kernels cannot run",
               wrapper ? wrapper->magic : 0);
  } else {
    fb->image = header;
    fb->size = header->header_size + header->files_size;
    fb->valid = true;
  }
  std::lock_guard<std::mutex> lock(f.mu);
  f.fatbins.push_back(std::move(fb));
  return reinterpret_cast<void**>(f.fatbins.back().get());
}

TANDEM_API void __cudaRegisterFatBinaryEnd(void**) {}

// Runs from atexit, possibly after other libraries' destructors: only client bookkeeping,
// plus freeing remote modules while the sessions are still open (a dlclose'd library).
TANDEM_API void __cudaUnregisterFatBinary(void** handle) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const FatBinary* fb = AsFatBinary(handle);
  ForgetFatBinary(fb);
  for (auto it = f.kernels.begin(); it != f.kernels.end();) {
    if (it->second->fatbin != fb) {
      ++it;
      continue;
    }
    f.kernel_set.erase(it->second.get());
    it = f.kernels.erase(it);
  }
  std::erase_if(f.symbols, [&](const auto& e) { return e.second->fatbin == fb; });
  std::erase_if(f.fatbins, [&](const auto& p) { return p.get() == fb; });
}

TANDEM_API void __cudaRegisterFunction(void** handle, const char* host_fun, char* device_fun,
                                       const char* device_name, int, uint3*, uint3*, dim3*, dim3*, int*) {
  Frontend& f = Frontend::Get();
  const char* name = device_fun ? device_fun : device_name;
  if (!host_fun || !name) {
    log::Error("__cudaRegisterFunction without a host function or a kernel name: ignored");
    return;
  }
  auto k = std::make_unique<Kernel>();
  k->fatbin = AsFatBinary(handle);
  k->host_fun = host_fun;
  k->name = name;
  std::lock_guard<std::mutex> lock(f.mu);
  // The first registration of a stub stays: launch sites and devices may already hold it.
  if (f.kernels.count(host_fun)) return;
  f.kernel_set.insert(k.get());
  f.kernels[host_fun] = std::move(k);
}

TANDEM_API void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* device_name,
                                  int, size_t size, int, int) {
  Frontend& f = Frontend::Get();
  auto s = std::make_unique<Symbol>();
  s->fatbin = AsFatBinary(handle);
  s->host_var = host_var;
  s->name = device_address ? device_address : device_name;
  s->size = size;
  std::lock_guard<std::mutex> lock(f.mu);
  f.symbols[host_var] = std::move(s);
}

// Managed memory would need the host and device to share pages: not available remotely. The
// host's accesses (nvcc turns them into *hostVarPtrAddress) go to host memory of its own, zeroed
// as the variable starts, so the program does not fault on them; the module's kernels, which
// would see other bytes, are refused with cudaErrorNotSupported (Launch).
TANDEM_API void __cudaRegisterManagedVar(void** handle, void** host_var_ptr, char*, const char* device_name, int,
                                         size_t size, int, int) {
  log::Error("__managed__ variable {}: managed memory is not supported by Tandem; this module's kernels will not launch",
             device_name ? device_name : "?");
  if (handle) AsFatBinary(handle)->managed = true;
  if (host_var_ptr) {  // for the program's life; aligned as the widest type (a float4, a double2)
    const size_t bytes = (std::max<size_t>(size, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, bytes);
    if (p) std::memset(p, 0, bytes);
    *host_var_ptr = p;
  }
}

// Host variables referenced from device code (__host__ __device__ globals of -rdc builds
// with nvc++): nothing to do remotely.
TANDEM_API void __cudaRegisterHostVar(void**, const char* device_name, char*, size_t) {
  log::Once(std::string("__cudaRegisterHostVar ") + (device_name ? device_name : "?"));
}

TANDEM_API void __cudaRegisterUnifiedTable(void*) { log::Once("__cudaRegisterUnifiedTable"); }

// Modules load lazily on first use; there is nothing to initialise eagerly.
TANDEM_API char __cudaInitModule(void**) { return 1; }

TANDEM_API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  t_configs.push_back(CallConfig{grid, block, shared, stream});
  return 0;
}

TANDEM_API cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  if (t_configs.empty()) return Return(cudaErrorMissingConfiguration);
  const CallConfig c = t_configs.back();
  t_configs.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

// cudaKernel_t values are our Kernel records.
TANDEM_API cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_fun) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.kernels.find(host_fun);
  if (!kernel || it == f.kernels.end()) return Return(cudaErrorInvalidDeviceFunction);
  *kernel = reinterpret_cast<cudaKernel_t>(it->second.get());
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGetKernel(cudaKernel_t* kernel, const void* entry) { return __cudaGetKernel(kernel, entry); }

// cudaFunction_t values are our Kernel records too.
TANDEM_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t* fn, const void* symbol) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const Kernel* k = FindKernel(symbol);
  if (!fn || !k) return Return(cudaErrorInvalidDeviceFunction);
  *fn = reinterpret_cast<cudaFunction_t>(const_cast<Kernel*>(k));
  return cudaSuccess;
}
