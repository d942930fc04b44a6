// Modules (the client's fatbinary, cubin or PTX exactly as it registered it; the driver picks
// SASS or JITs PTX), their globals and functions, with parameter layouts from the driver.
#include <elf.h>

#include <cstring>

#include <fmt/format.h>

#include "cuda_backend.h"

namespace tandem::server::cuda {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr size_t kFatbinHeader = 16;  // u32 magic, u16 version, u16 header_size, u64 files_size

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The driver trusts the sizes inside an image: make sure every one stays inside the bytes the
// client sent. A fatbinary is header_size + files_size bytes; a cubin's section and program
// headers and sections lie inside it; PTX is text (it gets its terminating NUL).
Status CheckImage(const ir::bytes& image, bool* needs_nul) {
  *needs_nul = false;
  const uint8_t* p = image.data();
  const size_t n = image.size();
  if (n >= kFatbinHeader && Load<uint32_t>(p) == kFatbinMagic) {
    const uint64_t header = Load<uint16_t>(p + 6), files = Load<uint64_t>(p + 8);
    if (header < kFatbinHeader || files > n || header > n - files)
      return Status::Invalid(fmt::format("fatbinary of {} bytes claims {} + {}", n, header, files));
    return Status::Ok();
  }
  if (n >= sizeof(Elf64_Ehdr) && std::memcmp(p, ELFMAG, SELFMAG) == 0) {
    const auto eh = Load<Elf64_Ehdr>(p);
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) return Status::Invalid("cubin is not a 64-bit ELF image");
    auto table_fits = [n](uint64_t off, uint64_t count, uint64_t entry, uint64_t want) {
      return count == 0 || (entry == want && off <= n && count <= (n - off) / entry);
    };
    if (!table_fits(eh.e_shoff, eh.e_shnum, eh.e_shentsize, sizeof(Elf64_Shdr)) ||
        !table_fits(eh.e_phoff, eh.e_phnum, eh.e_phentsize, sizeof(Elf64_Phdr)))
      return Status::Invalid(fmt::format("cubin of {} bytes: its header tables lie outside it", n));
    for (size_t i = 0; i < eh.e_shnum; ++i) {
      const auto sh = Load<Elf64_Shdr>(p + eh.e_shoff + i * sizeof(Elf64_Shdr));
      if (sh.sh_type != SHT_NOBITS && (sh.sh_offset > n || sh.sh_size > n - sh.sh_offset))
        return Status::Invalid(fmt::format("cubin of {} bytes: section {} lies outside it", n, i));
    }
    for (size_t i = 0; i < eh.e_phnum; ++i) {
      const auto ph = Load<Elf64_Phdr>(p + eh.e_phoff + i * sizeof(Elf64_Phdr));
      if (ph.p_offset > n || ph.p_filesz > n - ph.p_offset)
        return Status::Invalid(fmt::format("cubin of {} bytes: segment {} lies outside it", n, i));
    }
    return Status::Ok();
  }
  const std::string_view text(reinterpret_cast<const char*>(p), n);
  const size_t nul = text.find('\0');
  if (text.find(".target") != std::string_view::npos && (nul == std::string_view::npos || nul == n - 1)) {
    *needs_nul = nul == std::string_view::npos;
    return Status::Ok();
  }
  return Status::Invalid(fmt::format("module image of {} bytes is not a fatbinary, cubin or PTX", n));
}

}  // namespace

Status CudaBackend::OnModuleLoad(const ir::ModuleLoadReq& req, ir::ModuleLoadRep*) {
  if (req.module == 0) return Status::Invalid("module handle 0 is reserved");
  if (modules_.contains(req.module)) return Status::Invalid(fmt::format("module {} already exists", req.module));
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  if (req.kind != static_cast<uint32_t>(ir::ModuleKind::kCudaImage))
    return Status::Invalid(fmt::format("module kind {} is not a CUDA image", req.kind));
  bool needs_nul = false;
  TANDEM_RETURN_IF_ERROR(CheckImage(req.image, &needs_nul));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  ir::bytes terminated;
  if (needs_nul) {
    terminated.reserve(req.image.size() + 1);
    terminated.assign(req.image.begin(), req.image.end());
    terminated.push_back(0);
  }
  CUmodule mod = nullptr;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuModuleLoadData(&mod, needs_nul ? terminated.data() : req.image.data()),
                               "cuModuleLoadData"));
  modules_[req.module] = Module{device, mod, {}};
  return Status::Ok();
}

// CUDA images arrive built: nothing to compile, and no log.
Status CudaBackend::OnModuleBuild(const ir::ModuleBuildReq& req, ir::ModuleBuildRep* rep) {
  if (!modules_.contains(req.module)) return Status::Unknown(fmt::format("unknown module {}", req.module));
  rep->status = 0;
  return Status::Ok();
}

// Its functions stay known as orphans, so a later FunctionFree of them succeeds.
Status CudaBackend::OnModuleFree(const ir::ModuleFreeReq& req, ir::ModuleFreeRep*) {
  auto it = modules_.find(req.module);
  if (it == modules_.end()) return Status::Unknown(fmt::format("unknown module {}", req.module));
  const Module m = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(m.device));
  modules_.erase(it);
  for (uint64_t g : m.globals) ranges_.erase(g);
  std::erase_if(functions_, [&](const auto& f) {
    if (f.second.module != req.module) return false;
    orphaned_functions_.insert(f.first);
    return true;
  });
  return Check(m.device, drv_->cuModuleUnload(m.mod), "cuModuleUnload");
}

// A __device__/__constant__ variable: its address becomes valid for absolute addressing.
Status CudaBackend::OnModuleGlobal(const ir::ModuleGlobalReq& req, ir::ModuleGlobalRep* rep) {
  auto it = modules_.find(req.module);
  if (it == modules_.end()) return Status::Unknown(fmt::format("unknown module {}", req.module));
  if (req.name.empty() || req.name.find('\0') != std::string::npos)
    return Status::Invalid("ModuleGlobal needs a symbol name");
  Module& m = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(m.device));
  CUdeviceptr address = 0;
  size_t size = 0;
  TANDEM_RETURN_IF_ERROR(Check(m.device, drv_->cuModuleGetGlobal(&address, &size, m.mod, req.name.c_str()),
                               fmt::format("cuModuleGetGlobal({})", req.name)));
  rep->address = address;
  rep->size = size;
  if (size > 0 && ranges_.emplace(address, Range{address + size, m.device}).second) m.globals.push_back(address);
  return Status::Ok();
}

Status CudaBackend::DescribeFunction(const Function& f, ir::FunctionInfo* info) {
  info->name = f.name;
  info->num_params = static_cast<uint32_t>(f.params.size());
  info->params = f.params;
  // Attributes this driver does not know answer an error and are left out.
  for (int a = 0; a < CU_FUNC_ATTRIBUTE_MAX; ++a) {
    int v = 0;
    if (drv_->cuFuncGetAttribute(&v, static_cast<CUfunction_attribute>(a), f.fn) != CUDA_SUCCESS) continue;
    info->attrs.push_back(ir::Prop{ir::kCudaFuncAttrBase + static_cast<uint32_t>(a), {}});
    for (int i = 0; i < 4; ++i) info->attrs.back().value.push_back(static_cast<uint8_t>(static_cast<uint32_t>(v) >> (8 * i)));
    if (a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) info->max_block = static_cast<uint64_t>(v);
    if (a == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) info->local_mem = static_cast<uint64_t>(v);
    if (a == CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) info->private_mem = static_cast<uint64_t>(v);
  }
  int warp = 0;
  TANDEM_RETURN_IF_ERROR(Check(f.device,
                               drv_->cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, devices_[f.device].dev),
                               "cuDeviceGetAttribute"));
  info->preferred_multiple = static_cast<uint64_t>(warp);
  return Status::Ok();
}

Status CudaBackend::OnFunctionGet(const ir::FunctionGetReq& req, ir::FunctionGetRep* rep) {
  if (req.function == 0) return Status::Invalid("function handle 0 is reserved");
  if (functions_.contains(req.function) || orphaned_functions_.contains(req.function))
    return Status::Invalid(fmt::format("function {} already exists", req.function));
  auto it = modules_.find(req.module);
  if (it == modules_.end()) return Status::Unknown(fmt::format("unknown module {}", req.module));
  if (req.name.empty() || req.name.find('\0') != std::string::npos)
    return Status::Invalid("FunctionGet needs a kernel name");
  if (!drv_->cuFuncGetParamInfo)
    return Status(Code::kUnimplemented, "the CUDA driver lacks cuFuncGetParamInfo (driver 12.4 or newer is needed)");
  const Module& m = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(m.device));
  Function f{req.module, m.device, nullptr, req.name, {}};
  TANDEM_RETURN_IF_ERROR(
      Check(m.device, drv_->cuModuleGetFunction(&f.fn, m.mod, req.name.c_str()), fmt::format("cuModuleGetFunction({})", req.name)));
  // Parameters are numbered from 0 until the driver answers CUDA_ERROR_INVALID_VALUE.
  for (size_t i = 0; i < ir::kMaxListItems; ++i) {
    size_t offset = 0, size = 0;
    CUresult r = drv_->cuFuncGetParamInfo(f.fn, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    TANDEM_RETURN_IF_ERROR(Check(m.device, r, fmt::format("cuFuncGetParamInfo({}, {})", req.name, i)));
    f.params.push_back(ir::ParamInfo{static_cast<uint32_t>(offset), static_cast<uint32_t>(size),
                                     static_cast<uint32_t>(ir::ParamKind::kValue), {}, {}});
  }
  TANDEM_RETURN_IF_ERROR(DescribeFunction(f, &rep->info));
  functions_[req.function] = std::move(f);
  return Status::Ok();
}

Status CudaBackend::OnFunctionFree(const ir::FunctionFreeReq& req, ir::FunctionFreeRep*) {
  if (functions_.erase(req.function) || orphaned_functions_.erase(req.function)) return Status::Ok();
  return Status::Unknown(fmt::format("unknown function {}", req.function));
}

Status CudaBackend::OnFunctionSetAttr(const ir::FunctionSetAttrReq& req, ir::FunctionSetAttrRep*) {
  auto it = functions_.find(req.function);
  if (it == functions_.end()) return Status::Unknown(fmt::format("unknown function {}", req.function));
  if (req.attr >= CU_FUNC_ATTRIBUTE_MAX)
    return Status::Invalid(fmt::format("function attribute {} does not exist", req.attr));
  const Function& f = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(f.device));
  return Check(f.device, drv_->cuFuncSetAttribute(f.fn, static_cast<CUfunction_attribute>(req.attr), req.value),
               "cuFuncSetAttribute");
}

Status CudaBackend::OnFunctionSetCacheConfig(const ir::FunctionSetCacheConfigReq& req,
                                             ir::FunctionSetCacheConfigRep*) {
  auto it = functions_.find(req.function);
  if (it == functions_.end()) return Status::Unknown(fmt::format("unknown function {}", req.function));
  if (req.config > CU_FUNC_CACHE_PREFER_EQUAL) return Status::Invalid(fmt::format("cache configuration {}", req.config));
  const Function& f = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(f.device));
  return Check(f.device, drv_->cuFuncSetCacheConfig(f.fn, static_cast<CUfunc_cache>(req.config)), "cuFuncSetCacheConfig");
}

Status CudaBackend::OnOccupancy(const ir::OccupancyReq& req, ir::OccupancyRep* rep) {
  auto it = functions_.find(req.function);
  if (it == functions_.end()) return Status::Unknown(fmt::format("unknown function {}", req.function));
  if (req.block == 0 || req.block > INT32_MAX) return Status::Invalid(fmt::format("Occupancy: block size {}", req.block));
  const Function& f = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(f.device));
  int blocks = 0;
  TANDEM_RETURN_IF_ERROR(Check(f.device,
                               drv_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f.fn, static_cast<int>(req.block),
                                                                                 req.shared_bytes),
                               "cuOccupancyMaxActiveBlocksPerMultiprocessor"));
  rep->blocks = static_cast<uint32_t>(blocks);
  return Status::Ok();
}

}  // namespace tandem::server::cuda
