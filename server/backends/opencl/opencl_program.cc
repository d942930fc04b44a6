// Modules (cl_program from source or binary, build with log, binaries) and functions
// (cl_kernel with the parameter and work-group facts a client needs to launch it).
#include <fmt/format.h>

#include <array>
#include <cstring>

#include "opencl_backend.h"
#include "tandem/log.h"

namespace tandem::server::opencl {
namespace {

ir::ParamKind KindOf(cl_kernel_arg_address_qualifier q, const std::string& type_name) {
  if (type_name == "sampler_t") return ir::ParamKind::kSampler;
  if (type_name.rfind("image", 0) == 0) return ir::ParamKind::kImage;
  switch (q) {
    case CL_KERNEL_ARG_ADDRESS_GLOBAL:
      return ir::ParamKind::kGlobal;
    case CL_KERNEL_ARG_ADDRESS_LOCAL:
      return ir::ParamKind::kLocal;
    case CL_KERNEL_ARG_ADDRESS_CONSTANT:
      return ir::ParamKind::kConstant;
    default:
      return ir::ParamKind::kValue;
  }
}

// The size of a by-value parameter of a built-in scalar or vector type, from its type name
// ("int", "float4", "uchar16"; a 3-vector takes 4 elements' room); 0 for any other (structs,
// size_t, whose size the device decides): the front end's clSetKernelArg then checks nothing.
uint32_t ValueSize(const std::string& type_name) {
  static const std::pair<const char*, uint32_t> kScalars[] = {
      {"char", 1}, {"uchar", 1}, {"short", 2}, {"ushort", 2}, {"half", 2}, {"int", 4},
      {"uint", 4}, {"float", 4}, {"long", 8}, {"ulong", 8}, {"double", 8}};
  for (const auto& [name, size] : kScalars) {
    const size_t n = std::strlen(name);
    if (type_name.compare(0, n, name) != 0) continue;
    const std::string rest = type_name.substr(n);
    if (rest.empty()) return size;
    for (uint32_t lanes : {2u, 3u, 4u, 8u, 16u})
      if (rest == std::to_string(lanes)) return size * (lanes == 3 ? 4 : lanes);
  }
  return 0;
}

template <class T>
cl_int WorkGroupInfo(cl_kernel k, cl_device_id d, cl_kernel_work_group_info p, T* out) {
  return clGetKernelWorkGroupInfo(k, d, p, sizeof(T), out, nullptr);
}

}  // namespace

Status OpenCLBackend::DescribeKernel(cl_kernel k, cl_device_id dev, ir::FunctionInfo* info) {
  cl_int err = QueryString(
      [&](size_t n, void* v, size_t* r) { return clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, n, v, r); }, &info->name);
  if (err != CL_SUCCESS) return ClError(err, "clGetKernelInfo(CL_KERNEL_FUNCTION_NAME)");
  cl_uint nargs = 0;
  err = clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof(nargs), &nargs, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetKernelInfo(CL_KERNEL_NUM_ARGS)");
  info->num_params = nargs;
  // Argument facts need arg info; without it every parameter is a plain value.
  for (cl_uint i = 0; i < nargs; ++i) {
    ir::ParamInfo p;
    cl_kernel_arg_address_qualifier q = CL_KERNEL_ARG_ADDRESS_PRIVATE;
    err = clGetKernelArgInfo(k, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof(q), &q, nullptr);
    if (err == CL_SUCCESS) {
      // Names may be withheld (built without -cl-kernel-arg-info): then they stay empty.
      err = QueryString(
          [&](size_t n, void* v, size_t* r) { return clGetKernelArgInfo(k, i, CL_KERNEL_ARG_TYPE_NAME, n, v, r); },
          &p.type_name);
      if (err == CL_SUCCESS)
        err = QueryString(
            [&](size_t n, void* v, size_t* r) { return clGetKernelArgInfo(k, i, CL_KERNEL_ARG_NAME, n, v, r); },
            &p.name);
      // Qualifiers where the names are known; a driver that will not say leaves them unknown
      // (answered as none), which costs the program nothing it could act on.
      if (err == CL_SUCCESS) {
        cl_kernel_arg_access_qualifier access = 0;
        cl_kernel_arg_type_qualifier type_qualifier = 0;
        cl_int qerr = clGetKernelArgInfo(k, i, CL_KERNEL_ARG_ACCESS_QUALIFIER, sizeof(access), &access, nullptr);
        if (qerr == CL_SUCCESS)
          qerr = clGetKernelArgInfo(k, i, CL_KERNEL_ARG_TYPE_QUALIFIER, sizeof(type_qualifier), &type_qualifier, nullptr);
        if (qerr == CL_SUCCESS) {
          p.access = access;
          p.type_qualifier = type_qualifier;
        } else {
          log::Debug("opencl: qualifiers of argument {} of {}: {}", i, info->name, ClErrorName(qerr));
        }
      }
      if (err != CL_SUCCESS && err != CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
        return ClError(err, "clGetKernelArgInfo", fmt::format("argument {} of {}", i, info->name));
    } else if (err != CL_KERNEL_ARG_INFO_NOT_AVAILABLE) {
      return ClError(err, "clGetKernelArgInfo", fmt::format("argument {} of {}", i, info->name));
    }
    p.kind = static_cast<uint32_t>(KindOf(q, p.type_name));
    if (p.kind == static_cast<uint32_t>(ir::ParamKind::kValue)) p.size = ValueSize(p.type_name);
    info->params.push_back(std::move(p));
  }
  size_t wg = 0;
  cl_ulong local = 0, priv = 0;
  size_t multiple = 0;
  std::array<size_t, 3> compile{};
  if ((err = WorkGroupInfo(k, dev, CL_KERNEL_WORK_GROUP_SIZE, &wg)) != CL_SUCCESS ||
      (err = WorkGroupInfo(k, dev, CL_KERNEL_LOCAL_MEM_SIZE, &local)) != CL_SUCCESS ||
      (err = WorkGroupInfo(k, dev, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, &multiple)) != CL_SUCCESS ||
      (err = WorkGroupInfo(k, dev, CL_KERNEL_PRIVATE_MEM_SIZE, &priv)) != CL_SUCCESS ||
      (err = WorkGroupInfo(k, dev, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, &compile)) != CL_SUCCESS)
    return ClError(err, "clGetKernelWorkGroupInfo", info->name);
  info->max_block = wg;
  info->local_mem = local;
  info->preferred_multiple = multiple;
  info->private_mem = priv;
  info->compile_block.assign(compile.begin(), compile.end());
  ir::Prop attrs{CL_KERNEL_ATTRIBUTES, {}};
  err = QueryBytes([&](size_t n, void* v, size_t* r) { return clGetKernelInfo(k, CL_KERNEL_ATTRIBUTES, n, v, r); },
                   &attrs.value);
  if (err != CL_SUCCESS) return ClError(err, "clGetKernelInfo(CL_KERNEL_ATTRIBUTES)", info->name);
  info->attrs.push_back(std::move(attrs));
  return Status::Ok();
}

Status OpenCLBackend::OnModuleLoad(const ir::ModuleLoadReq& req, ir::ModuleLoadRep*) {
  TANDEM_RETURN_IF_ERROR(CheckNew(modules_, req.module, "module"));
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  if (req.image.empty()) return Status::Invalid(fmt::format("module {:#x} has an empty image", req.module));
  cl_int err = CL_SUCCESS;
  cl_program prog = nullptr;
  const auto* data = reinterpret_cast<const char*>(req.image.data());
  const size_t size = req.image.size();
  switch (static_cast<ir::ModuleKind>(req.kind)) {
    case ir::ModuleKind::kOpenCLSource:
      prog = clCreateProgramWithSource(d.value()->context.get(), 1, &data, &size, &err);
      if (err != CL_SUCCESS) return ClError(err, "clCreateProgramWithSource");
      break;
    case ir::ModuleKind::kOpenCLBinary: {
      const auto* bin = req.image.data();
      cl_int bin_status = CL_SUCCESS;
      prog = clCreateProgramWithBinary(d.value()->context.get(), 1, &d.value()->id, &size, &bin, &bin_status, &err);
      if (err == CL_SUCCESS && bin_status != CL_SUCCESS) {
        clReleaseProgram(prog);
        err = bin_status;
      }
      if (err != CL_SUCCESS) return ClError(err, "clCreateProgramWithBinary");
      break;
    }
    case ir::ModuleKind::kCudaImage:
      return Status::Invalid("the OpenCL backend cannot load a CUDA image");
    default:
      return Status::Invalid(fmt::format("unknown module kind {}", req.kind));
  }
  modules_[req.module] = Module{ProgramRef(prog), static_cast<uint32_t>(req.device)};
  return Status::Ok();
}

// The build's own result travels in rep->status with the log, the reply itself is OK, so
// a failed build still delivers its log.
Status OpenCLBackend::OnModuleBuild(const ir::ModuleBuildReq& req, ir::ModuleBuildRep* rep) {
  auto m = Find(modules_, req.module, "module");
  if (!m.ok()) return m.status();
  cl_program prog = m.value()->program.get();
  cl_device_id dev = devices_[m.value()->device].id;
  // Argument facts (qualifiers, names) are only kept with -cl-kernel-arg-info; the client
  // launches best with them, so every build asks for them. NVIDIA's compiler (driver 580)
  // then fails any program with a kernel of no parameters (ptxas: "Parsing error near '}'"),
  // which builds without it: such a build is redone as the program asked, and the client
  // tells buffers from values itself, as for a program built from a binary.
  const bool added = req.options.find("-cl-kernel-arg-info") == std::string::npos;
  const std::string options = added ? req.options + " -cl-kernel-arg-info" : req.options;
  rep->status = clBuildProgram(prog, 1, &dev, options.c_str(), nullptr, nullptr);
  if (rep->status == CL_BUILD_PROGRAM_FAILURE && added) {
    rep->status = clBuildProgram(prog, 1, &dev, req.options.c_str(), nullptr, nullptr);
    if (rep->status == CL_SUCCESS)
      log::Info("module {:#x}: built without -cl-kernel-arg-info (the device's compiler failed with it)", req.module);
  }
  cl_int err = QueryString(
      [&](size_t n, void* v, size_t* r) { return clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, v, r); },
      &rep->log);
  if (err != CL_SUCCESS) return ClError(err, "clGetProgramBuildInfo(CL_PROGRAM_BUILD_LOG)");
  if (rep->status != CL_SUCCESS) return Status::Ok();
  std::string names;
  err = QueryString(
      [&](size_t n, void* v, size_t* r) { return clGetProgramInfo(prog, CL_PROGRAM_KERNEL_NAMES, n, v, r); }, &names);
  if (err != CL_SUCCESS) return ClError(err, "clGetProgramInfo(CL_PROGRAM_KERNEL_NAMES)");
  for (size_t start = 0; start < names.size();) {
    size_t end = names.find(';', start);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    cl_kernel k = clCreateKernel(prog, name.c_str(), &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateKernel", name);
    KernelRef kernel(k);
    ir::FunctionInfo info;
    TANDEM_RETURN_IF_ERROR(DescribeKernel(k, dev, &info));
    rep->functions.push_back(std::move(info));
  }
  return Status::Ok();
}

Status OpenCLBackend::OnModuleBinary(const ir::ModuleBinaryReq& req, ir::ModuleBinaryRep* rep) {
  auto m = Find(modules_, req.module, "module");
  if (!m.ok()) return m.status();
  cl_program prog = m.value()->program.get();
  size_t size = 0;  // one device per program, so one binary
  cl_int err = clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)");
  if (size == 0) return Status::Invalid(fmt::format("module {:#x} has no binary yet (build it first)", req.module));
  if (size > ir::kMaxBytes) return Status::Invalid(fmt::format("module binary of {} bytes is too large", size));
  rep->binary.resize(size);
  unsigned char* ptr = rep->binary.data();
  err = clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetProgramInfo(CL_PROGRAM_BINARIES)");
  return Status::Ok();
}

Status OpenCLBackend::OnModuleFree(const ir::ModuleFreeReq& req, ir::ModuleFreeRep*) {
  auto m = Find(modules_, req.module, "module");
  if (!m.ok()) return m.status();
  modules_.erase(req.module);  // kernels made from it keep the program alive
  return Status::Ok();
}

Status OpenCLBackend::OnFunctionGet(const ir::FunctionGetReq& req, ir::FunctionGetRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckNew(functions_, req.function, "function"));
  auto m = Find(modules_, req.module, "module");
  if (!m.ok()) return m.status();
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(m.value()->program.get(), req.name.c_str(), &err);
  if (err != CL_SUCCESS)
    return ClError(err, "clCreateKernel", fmt::format("kernel '{}' of module {:#x}", req.name, req.module));
  KernelRef kernel(k);
  const uint32_t device = m.value()->device;
  TANDEM_RETURN_IF_ERROR(DescribeKernel(k, devices_[device].id, &rep->info));
  cl_ulong device_local = 0;
  err = clGetDeviceInfo(devices_[device].id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof device_local, &device_local, nullptr);
  if (err != CL_SUCCESS) return ClError(err, "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)");
  functions_[req.function] =
      Function{std::move(kernel), device, rep->info.num_params, rep->info.local_mem, device_local, {}};
  return Status::Ok();
}

Status OpenCLBackend::OnFunctionFree(const ir::FunctionFreeReq& req, ir::FunctionFreeRep*) {
  auto f = Find(functions_, req.function, "function");
  if (!f.ok()) return f.status();
  functions_.erase(req.function);
  return Status::Ok();
}

}  // namespace tandem::server::opencl
