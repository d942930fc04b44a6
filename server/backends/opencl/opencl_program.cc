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
  modules_[req.module] = Module{ProgramRef(prog), static_cast<uint32_t>(req.device),
                                static_cast<ir::ModuleKind>(req.kind) == ir::ModuleKind::kOpenCLSource};
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
  TANDEM_RETURN_IF_ERROR(BuildLog(prog, dev, &rep->log));
  if (rep->status != CL_SUCCESS) return Status::Ok();
  return DescribeKernels(prog, dev, &rep->functions);
}

Status OpenCLBackend::BuildLog(cl_program prog, cl_device_id dev, std::string* log) {
  cl_int err = QueryString(
      [&](size_t n, void* v, size_t* r) { return clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, v, r); }, log);
  if (err != CL_SUCCESS) return ClError(err, "clGetProgramBuildInfo(CL_PROGRAM_BUILD_LOG)");
  return Status::Ok();
}

Status OpenCLBackend::DescribeKernels(cl_program prog, cl_device_id dev, ir::FuncList* out) {
  std::string names;
  cl_int err = QueryString(
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
    out->push_back(std::move(info));
  }
  return Status::Ok();
}

// As a build, with the argument facts asked for (and dropped again where the compiler fails
// with them); the headers are other modules of the same device, under the names the program
// gave them.
Status OpenCLBackend::OnModuleCompile(const ir::ModuleCompileReq& req, ir::ModuleCompileRep* rep) {
  auto m = Find(modules_, req.module, "module");
  if (!m.ok()) return m.status();
  if (!m.value()->from_source)
    return Status::Invalid(fmt::format("ModuleCompile: module {:#x} was not loaded from source", req.module));
  const uint32_t device = m.value()->device;
  std::vector<std::string> names;
  for (size_t start = 0; start < req.header_names.size();) {
    const auto* begin = req.header_names.data() + start;
    const auto* nul = static_cast<const uint8_t*>(std::memchr(begin, 0, req.header_names.size() - start));
    const size_t len = nul ? static_cast<size_t>(nul - begin) : req.header_names.size() - start;
    names.emplace_back(reinterpret_cast<const char*>(begin), len);
    start += len + 1;
  }
  if (names.size() != req.headers.size())
    return Status::Invalid(fmt::format("ModuleCompile: {} header modules but {} header names", req.headers.size(),
                                       names.size()));
  std::vector<cl_program> headers;
  std::vector<const char*> header_names;
  for (size_t i = 0; i < req.headers.size(); ++i) {
    auto h = Find(modules_, req.headers[i], "header module");
    if (!h.ok()) return h.status();
    if (h.value()->device != device)
      return Status::Invalid(fmt::format("ModuleCompile: header module {:#x} is on device {}, the module on {}",
                                         req.headers[i], h.value()->device, device));
    if (!h.value()->from_source)
      return Status::Invalid(fmt::format("ModuleCompile: header module {:#x} was not loaded from source", req.headers[i]));
    if (!ir::SafeIncludeName(names[i]))
      return Status::Invalid(
          fmt::format("ModuleCompile: header name '{}' is not a relative path of plain components", names[i]));
    headers.push_back(h.value()->program.get());
    header_names.push_back(names[i].c_str());
  }
  cl_program prog = m.value()->program.get();
  cl_device_id dev = devices_[device].id;
  auto compile = [&](const std::string& options) {
    return clCompileProgram(prog, 1, &dev, options.c_str(), static_cast<cl_uint>(headers.size()),
                            headers.empty() ? nullptr : headers.data(),
                            header_names.empty() ? nullptr : header_names.data(), nullptr, nullptr);
  };
  const bool added = req.options.find("-cl-kernel-arg-info") == std::string::npos;
  rep->status = compile(added ? req.options + " -cl-kernel-arg-info" : req.options);
  if (rep->status == CL_COMPILE_PROGRAM_FAILURE && added) rep->status = compile(req.options);
  return BuildLog(prog, dev, &rep->log);
}

// clLinkProgram makes a new program: it becomes `module` when the driver returns one (with
// the log of a failed link too), and only an executable has kernels to describe.
Status OpenCLBackend::OnModuleLink(const ir::ModuleLinkReq& req, ir::ModuleLinkRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckNew(modules_, req.module, "module"));
  auto d = DeviceAt(req.device);
  if (!d.ok()) return d.status();
  if (req.inputs.empty()) return Status::Invalid("ModuleLink: no input modules");
  std::vector<cl_program> inputs;
  for (uint64_t in : req.inputs) {
    auto m = Find(modules_, in, "input module");
    if (!m.ok()) return m.status();
    if (m.value()->device != req.device)
      return Status::Invalid(fmt::format("ModuleLink: input module {:#x} is on device {}, the link on {}", in,
                                         m.value()->device, req.device));
    inputs.push_back(m.value()->program.get());
  }
  cl_device_id dev = d.value()->id;
  cl_int err = CL_SUCCESS;
  cl_program out = clLinkProgram(d.value()->context.get(), 1, &dev, req.options.c_str(),
                                 static_cast<cl_uint>(inputs.size()), inputs.data(), nullptr, nullptr, &err);
  rep->status = err;
  if (!out) {
    if (rep->status == CL_SUCCESS) rep->status = CL_LINK_PROGRAM_FAILURE;
    return Status::Ok();
  }
  ProgramRef program(out);
  // A reply that fails leaves no module behind: the client then knows of none to free.
  auto describe = [&]() -> Status {
    TANDEM_RETURN_IF_ERROR(BuildLog(out, dev, &rep->log));
    if (rep->status != CL_SUCCESS) return Status::Ok();
    cl_program_binary_type type = CL_PROGRAM_BINARY_TYPE_NONE;
    cl_int e = clGetProgramBuildInfo(out, dev, CL_PROGRAM_BINARY_TYPE, sizeof(type), &type, nullptr);
    if (e != CL_SUCCESS) return ClError(e, "clGetProgramBuildInfo(CL_PROGRAM_BINARY_TYPE)");
    rep->binary_type = static_cast<uint32_t>(type);
    if (type != CL_PROGRAM_BINARY_TYPE_EXECUTABLE) return Status::Ok();
    return DescribeKernels(out, dev, &rep->functions);
  };
  TANDEM_RETURN_IF_ERROR(describe());
  modules_[req.module] = Module{std::move(program), static_cast<uint32_t>(req.device), false};
  rep->created = 1;
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
