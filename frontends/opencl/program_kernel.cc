// Programs (one remote module per device: source or binary, built with ModuleBuild) and
// kernels (one remote function per device). Kernel arguments are gathered on the client
// and sent with each launch; kernel and argument info come from the FunctionInfo of the
// build reply, so none of these queries touches the network.
#include <algorithm>

#include "objects.h"

namespace tandem::ocl {
namespace {

// Built into an executable: kernels can be made (a compiled object or a library has none).
bool Built(const _cl_program::PerDevice& pd) {
  return pd.status == CL_BUILD_SUCCESS && pd.binary_type == CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
}

// The devices a build, compile or link runs for: the list given, or every device of `all`.
cl_int Targets(cl_program p, cl_uint num_devices, const cl_device_id* device_list,
               std::vector<std::pair<cl_device_id, uint64_t>>* targets) {
  if (device_list) {
    for (cl_uint i = 0; i < num_devices; ++i) {
      auto* pd = p->For(device_list[i]);
      if (!pd) return CL_INVALID_DEVICE;
      targets->emplace_back(pd->device, pd->module);
    }
  } else {
    for (auto& pd : p->per_device) targets->emplace_back(pd.device, pd.module);
  }
  return CL_SUCCESS;
}

// Loads one module per device, posted: creation never waits.
cl_program MakeProgram(cl_context context, const std::vector<cl_device_id>& devices, ir::ModuleKind kind,
                       const std::vector<std::vector<uint8_t>>& images, cl_int* errcode_ret) {
  auto p = std::make_unique<_cl_program>();
  p->context = context;
  p->from_binary = kind == ir::ModuleKind::kOpenCLBinary;
  for (size_t i = 0; i < devices.size(); ++i) {
    _cl_program::PerDevice pd;
    pd.device = devices[i];
    pd.module = client::Runtime::Get().NewHandle();
    const auto& image = images[images.size() == 1 ? 0 : i];
    devices[i]->session().Post(
        ir::ModuleLoadReq{pd.module, devices[i]->remote->remote_index, static_cast<uint32_t>(kind), image});
    if (p->from_binary) pd.binary = image;
    p->per_device.push_back(std::move(pd));
  }
  context->Hold();
  SetErr(errcode_ret, CL_SUCCESS);
  return Publish(p.release());
}

// Creates a kernel for `name` with a remote function on every device the program was
// built for. The caller holds program->mu.
cl_kernel MakeKernelLocked(cl_program program, const std::string& name) {
  std::vector<std::pair<const _cl_program::PerDevice*, const ir::FunctionInfo*>> found;
  for (const auto& pd : program->per_device) {
    if (!Built(pd)) continue;
    auto fi = std::find_if(pd.functions.begin(), pd.functions.end(), [&](const auto& f) { return f.name == name; });
    if (fi != pd.functions.end()) found.emplace_back(&pd, &*fi);
  }
  if (found.empty()) return nullptr;
  auto k = std::make_unique<_cl_kernel>();
  k->program = program;
  k->name = name;
  for (const auto& [pd, fi] : found) {
    uint64_t fn = client::Runtime::Get().NewHandle();
    pd->device->session().Post(ir::FunctionGetReq{fn, pd->module, name});
    k->functions.emplace_back(pd->device, fn);
    k->device_info.emplace_back(pd->device, *fi);
  }
  k->info = k->device_info.front().second;
  k->args.resize(k->info.num_params);
  program->kernels++;
  program->Hold();
  return Publish(k.release());
}

cl_int BuildFailure(const _cl_program* p, int32_t status) {
  if (status < 0 && status != CL_BUILD_PROGRAM_FAILURE) return status;
  return p->from_binary ? CL_INVALID_BINARY : CL_BUILD_PROGRAM_FAILURE;
}

}  // namespace

cl_program CreateProgramWithSource(cl_context context, cl_uint count, const char** strings, const size_t* lengths,
                                   cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  if (count == 0 || !strings) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  std::string source;
  for (cl_uint i = 0; i < count; ++i) {
    if (!strings[i]) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
    source.append(strings[i], lengths && lengths[i] ? lengths[i] : std::strlen(strings[i]));
  }
  std::vector<std::vector<uint8_t>> image{std::vector<uint8_t>(source.begin(), source.end())};
  cl_program p = MakeProgram(context, context->devices, ir::ModuleKind::kOpenCLSource, image, errcode_ret);
  p->source = std::move(source);
  p->from_source = true;
  return p;
}

cl_program CreateProgramWithBinary(cl_context context, cl_uint num_devices, const cl_device_id* device_list,
                                   const size_t* lengths, const unsigned char** binaries, cl_int* binary_status,
                                   cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  if (num_devices == 0 || !device_list || !lengths || !binaries) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  std::vector<cl_device_id> devices;
  std::vector<std::vector<uint8_t>> images;
  cl_int err = CL_SUCCESS;
  for (cl_uint i = 0; i < num_devices; ++i) {
    if (!context->Has(device_list[i])) return SetErr(errcode_ret, CL_INVALID_DEVICE), nullptr;
    bool ok = lengths[i] != 0 && binaries[i] != nullptr;
    if (binary_status) binary_status[i] = ok ? CL_SUCCESS : CL_INVALID_VALUE;
    if (!ok) err = CL_INVALID_VALUE;
    devices.push_back(device_list[i]);
    images.emplace_back(ok ? binaries[i] : nullptr, ok ? binaries[i] + lengths[i] : nullptr);
  }
  if (err != CL_SUCCESS) return SetErr(errcode_ret, err), nullptr;
  return MakeProgram(context, devices, ir::ModuleKind::kOpenCLBinary, images, errcode_ret);
}

cl_int RetainProgram(cl_program p) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  p->Retain();
  return CL_SUCCESS;
}

cl_int ReleaseProgram(cl_program p) {
  if (!Valid(p) || !p->Release()) return CL_INVALID_PROGRAM;
  return CL_SUCCESS;
}

// Marks a build or compile on `targets` as under way, unless the program has kernels or a build
// is under way already (CL_INVALID_OPERATION). Needs p->mu.
cl_int BeginBuildLocked(cl_program p, const std::vector<std::pair<cl_device_id, uint64_t>>& targets) {
  if (p->kernels > 0) return CL_INVALID_OPERATION;
  for (auto& pd : p->per_device)
    if (pd.status == CL_BUILD_IN_PROGRESS) return CL_INVALID_OPERATION;
  for (auto& t : targets) p->For(t.first)->status = CL_BUILD_IN_PROGRESS;
  return CL_SUCCESS;
}

// A device's program as a build or compile with `options` leaves it before its outcome is
// written in: no binary, no kernels.
void ClearBuild(_cl_program::PerDevice* pd, const std::string& options) {
  pd->options = options;
  pd->binary.reset();
  pd->functions.clear();
  pd->binary_type = CL_PROGRAM_BINARY_TYPE_NONE;
}

// Builds on each device in turn (ModuleBuild waits for the remote compiler); the log and
// the kernels' FunctionInfo come back with the reply.
cl_int BuildProgram(cl_program p, cl_uint num_devices, const cl_device_id* device_list, const char* options,
                    void(CL_CALLBACK* notify)(cl_program, void*), void* data) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  if ((num_devices == 0) != (device_list == nullptr) || (!notify && data)) return CL_INVALID_VALUE;
  std::vector<std::pair<cl_device_id, uint64_t>> targets;
  {
    std::lock_guard lock(p->mu);
    if (cl_int e = Targets(p, num_devices, device_list, &targets); e != CL_SUCCESS) return e;
    if (cl_int e = BeginBuildLocked(p, targets); e != CL_SUCCESS) return e;
  }
  cl_int result = CL_SUCCESS;
  std::string opts = options ? options : "";
  for (auto& [device, module] : targets) {
    auto r = CallOn(device->session(), ir::ModuleBuildReq{module, opts});
    std::lock_guard lock(p->mu);
    auto* pd = p->For(device);
    ClearBuild(pd, opts);
    if (r.ok() && r->status == CL_SUCCESS) {
      pd->status = CL_BUILD_SUCCESS;
      pd->binary_type = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
      pd->log = std::move(r->log);
      pd->functions = std::move(r->functions);
      continue;
    }
    pd->status = CL_BUILD_ERROR;
    if (r.ok()) {
      pd->log = std::move(r->log);
      if (result == CL_SUCCESS) result = BuildFailure(p, r->status);
    } else if (r.status().code() == Code::kBuildFailed) {
      pd->log = r.status().message();
      if (result == CL_SUCCESS) result = BuildFailure(p, r.status().native());
    } else if (r.status().code() == Code::kUnknownHandle) {
      // The server refused the posted ModuleLoad (its error went to the log): for a
      // binary, that is the spec's invalid binary.
      pd->loaded = false;
      pd->log = r.status().message();
      if (result == CL_SUCCESS) result = p->from_binary ? CL_INVALID_BINARY : CL_BUILD_PROGRAM_FAILURE;
    } else {
      pd->log = r.status().ToString();
      if (result == CL_SUCCESS) result = ToCl(r.status(), "clBuildProgram");
    }
  }
  if (notify) notify(p, data);
  return result;
}

// Compiles on each device in turn, like a build; the headers are programs from source of the
// same context, sent as their modules on that device.
cl_int CompileProgram(cl_program p, cl_uint num_devices, const cl_device_id* device_list, const char* options,
                      cl_uint num_headers, const cl_program* headers, const char** header_names,
                      void(CL_CALLBACK* notify)(cl_program, void*), void* data) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  if ((num_devices == 0) != (device_list == nullptr) || (!notify && data)) return CL_INVALID_VALUE;
  if ((num_headers == 0) != (headers == nullptr) || (num_headers == 0) != (header_names == nullptr))
    return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < num_headers; ++i) {
    if (!Valid(headers[i])) return CL_INVALID_PROGRAM;
    if (!header_names[i] || headers[i]->context != p->context) return CL_INVALID_VALUE;
    if (!ir::SafeIncludeName(header_names[i])) {
      log::Warn("clCompileProgram: header name '{}' refused: servers take only relative paths of plain components",
                header_names[i]);
      return CL_INVALID_VALUE;
    }
  }
  if (!p->from_source) return CL_INVALID_OPERATION;  // only a program from source compiles
  std::vector<std::pair<cl_device_id, uint64_t>> targets;
  {
    std::lock_guard lock(p->mu);
    if (cl_int e = Targets(p, num_devices, device_list, &targets); e != CL_SUCCESS) return e;
  }
  // Every header must be a program from source with a module on every target device: checked
  // before anything of the program changes.
  std::vector<std::vector<uint64_t>> header_modules(targets.size());
  for (cl_uint i = 0; i < num_headers; ++i) {
    if (!headers[i]->from_source) return CL_INVALID_OPERATION;
    std::lock_guard hl(headers[i]->mu);
    for (size_t t = 0; t < targets.size(); ++t) {
      const auto* hd = headers[i]->For(targets[t].first);
      if (!hd) return CL_INVALID_OPERATION;
      header_modules[t].push_back(hd->module);
    }
  }
  {
    std::lock_guard lock(p->mu);
    if (cl_int e = BeginBuildLocked(p, targets); e != CL_SUCCESS) return e;
  }
  ir::bytes names;
  for (cl_uint i = 0; i < num_headers; ++i) {
    names.insert(names.end(), header_names[i], header_names[i] + std::strlen(header_names[i]));
    names.push_back(0);
  }
  cl_int result = CL_SUCCESS;
  const std::string opts = options ? options : "";
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto& [device, module] = targets[t];
    auto r = CallOn(device->session(),
                    ir::ModuleCompileReq{.module = module, .options = opts, .headers = header_modules[t], .header_names = names});
    std::lock_guard lock(p->mu);
    auto* pd = p->For(device);
    ClearBuild(pd, opts);
    if (r.ok() && r->status == CL_SUCCESS) {
      pd->status = CL_BUILD_SUCCESS;
      pd->binary_type = CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT;
      pd->log = std::move(r->log);
      continue;
    }
    pd->status = CL_BUILD_ERROR;
    if (r.ok()) {
      pd->log = std::move(r->log);
      if (result == CL_SUCCESS) result = r->status < 0 ? r->status : CL_COMPILE_PROGRAM_FAILURE;
    } else {
      pd->log = r.status().ToString();
      if (result == CL_SUCCESS) result = ToCl(r.status(), "clCompileProgram");
    }
  }
  if (notify) notify(p, data);
  return result;
}

// A new program: one link per device, of the inputs' modules there. A link that ran and
// failed returns the program (its log readable) with CL_LINK_PROGRAM_FAILURE where the
// server's implementation made one on some device, and no program where none did (PoCL).
cl_program LinkProgram(cl_context context, cl_uint num_devices, const cl_device_id* device_list, const char* options,
                       cl_uint num_inputs, const cl_program* inputs, void(CL_CALLBACK* notify)(cl_program, void*),
                       void* data, cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  if ((num_devices == 0) != (device_list == nullptr) || num_inputs == 0 || !inputs || (!notify && data))
    return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  std::vector<cl_device_id> devices;
  if (device_list) {
    for (cl_uint i = 0; i < num_devices; ++i) {
      if (!context->Has(device_list[i])) return SetErr(errcode_ret, CL_INVALID_DEVICE), nullptr;
      devices.push_back(device_list[i]);
    }
  } else {
    devices = context->devices;
  }
  // For each device, either every input holds a compiled object or a library for it (it is
  // linked) or none does (it is skipped: no executable for it); anything else is refused.
  std::vector<std::vector<uint64_t>> modules(devices.size());
  for (cl_uint i = 0; i < num_inputs; ++i) {
    if (!Valid(inputs[i])) return SetErr(errcode_ret, CL_INVALID_PROGRAM), nullptr;
    if (inputs[i]->context != context) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
    if (inputs[i]->from_binary) {
      // Its binary type is the binary's, which the server does not report on loading.
      log::Once("clLinkProgram of a program created from a binary");
      return SetErr(errcode_ret, CL_INVALID_OPERATION), nullptr;
    }
    std::lock_guard lock(inputs[i]->mu);
    for (size_t d = 0; d < devices.size(); ++d) {
      const auto* pd = inputs[i]->For(devices[d]);
      if (pd && pd->status == CL_BUILD_SUCCESS &&
          (pd->binary_type == CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT || pd->binary_type == CL_PROGRAM_BINARY_TYPE_LIBRARY))
        modules[d].push_back(pd->module);
    }
  }
  for (const auto& m : modules)
    if (!m.empty() && m.size() != num_inputs) return SetErr(errcode_ret, CL_INVALID_OPERATION), nullptr;
  if (std::all_of(modules.begin(), modules.end(), [](const auto& m) { return m.empty(); }))
    return SetErr(errcode_ret, CL_INVALID_OPERATION), nullptr;
  auto p = std::make_unique<_cl_program>();
  p->context = context;
  const std::string opts = options ? options : "";
  cl_int result = CL_SUCCESS;
  for (size_t d = 0; d < devices.size(); ++d) {
    _cl_program::PerDevice pd;
    pd.device = devices[d];
    pd.module = client::Runtime::Get().NewHandle();
    pd.options = opts;
    if (modules[d].empty()) {  // nothing to link for this device
      pd.loaded = false;
      p->per_device.push_back(std::move(pd));
      continue;
    }
    auto r = CallOn(devices[d]->session(), ir::ModuleLinkReq{.module = pd.module,
                                                             .device = devices[d]->remote->remote_index,
                                                             .options = opts,
                                                             .inputs = modules[d]});
    pd.loaded = r.ok() && r->created;
    if (r.ok() && r->status == CL_SUCCESS) {
      pd.status = CL_BUILD_SUCCESS;
      pd.binary_type = static_cast<cl_program_binary_type>(r->binary_type);
      pd.log = std::move(r->log);
      pd.functions = std::move(r->functions);
    } else {
      pd.status = CL_BUILD_ERROR;
      if (r.ok()) {
        pd.log = std::move(r->log);
        if (result == CL_SUCCESS) result = r->status == CL_LINK_PROGRAM_FAILURE || r->status >= 0 ? CL_LINK_PROGRAM_FAILURE
                                                                                                  : r->status;
      } else {
        pd.log = r.status().ToString();
        if (result == CL_SUCCESS) result = ToCl(r.status(), "clLinkProgram");
      }
    }
    p->per_device.push_back(std::move(pd));
  }
  const bool created = std::any_of(p->per_device.begin(), p->per_device.end(),
                                   [](const auto& pd) { return pd.loaded; });
  context->Hold();
  cl_program out = Publish(p.release());
  if (notify) notify(out, data);
  // A failure of the link itself keeps the program (for its log) if a device made one; any
  // other drops it.
  if (result != CL_SUCCESS && (result != CL_LINK_PROGRAM_FAILURE || !created)) {
    ReleaseProgram(out);
    return SetErr(errcode_ret, result), nullptr;
  }
  SetErr(errcode_ret, result);
  return out;
}

cl_int GetProgramInfo(cl_program p, cl_program_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  std::unique_lock lock(p->mu);
  switch (param) {
    case CL_PROGRAM_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, p->refs.load());
    case CL_PROGRAM_CONTEXT:
      return AnswerValue(size, value, size_ret, p->context);
    case CL_PROGRAM_NUM_DEVICES:
      return AnswerValue(size, value, size_ret, static_cast<cl_uint>(p->per_device.size()));
    case CL_PROGRAM_DEVICES: {
      std::vector<cl_device_id> ids;
      for (auto& pd : p->per_device) ids.push_back(pd.device);
      return AnswerArray(size, value, size_ret, ids);
    }
    case CL_PROGRAM_SOURCE:
      return AnswerString(size, value, size_ret, p->source);
    case CL_PROGRAM_BINARY_SIZES:
    case CL_PROGRAM_BINARIES: {
      // The server's binary, fetched once per build (ModuleBinary).
      for (auto& pd : p->per_device) {
        if (pd.binary || pd.status != CL_BUILD_SUCCESS) continue;
        auto r = CallOn(pd.device->session(), ir::ModuleBinaryReq{pd.module});
        if (!r.ok()) return ToCl(r.status(), "clGetProgramInfo(CL_PROGRAM_BINARIES)", CL_INVALID_PROGRAM);
        pd.binary = std::move(r->binary);
      }
      if (param == CL_PROGRAM_BINARY_SIZES) {
        std::vector<size_t> sizes;
        for (auto& pd : p->per_device) sizes.push_back(pd.binary ? pd.binary->size() : 0);
        return AnswerArray(size, value, size_ret, sizes);
      }
      size_t need = p->per_device.size() * sizeof(unsigned char*);
      if (size_ret) *size_ret = need;
      if (!value) return CL_SUCCESS;
      if (size < need) return CL_INVALID_VALUE;
      auto** out = static_cast<unsigned char**>(value);
      for (size_t i = 0; i < p->per_device.size(); ++i) {
        const auto& bin = p->per_device[i].binary;
        if (out[i] && bin && !bin->empty()) std::memcpy(out[i], bin->data(), bin->size());
      }
      return CL_SUCCESS;
    }
    case CL_PROGRAM_NUM_KERNELS:
    case CL_PROGRAM_KERNEL_NAMES: {
      auto built = std::find_if(p->per_device.begin(), p->per_device.end(), Built);
      if (built == p->per_device.end()) return CL_INVALID_PROGRAM_EXECUTABLE;
      if (param == CL_PROGRAM_NUM_KERNELS) return AnswerValue(size, value, size_ret, built->functions.size());
      std::string names;
      for (const auto& f : built->functions) names += (names.empty() ? "" : ";") + f.name;
      return AnswerString(size, value, size_ret, names);
    }
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int GetProgramBuildInfo(cl_program p, cl_device_id device, cl_program_build_info param, size_t size, void* value,
                           size_t* size_ret) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  std::lock_guard lock(p->mu);
  auto* pd = p->For(device);
  if (!pd) return CL_INVALID_DEVICE;
  switch (param) {
    case CL_PROGRAM_BUILD_STATUS:
      return AnswerValue(size, value, size_ret, pd->status);
    case CL_PROGRAM_BUILD_OPTIONS:
      return AnswerString(size, value, size_ret, pd->options);
    case CL_PROGRAM_BUILD_LOG:
      return AnswerString(size, value, size_ret, pd->log);
    case CL_PROGRAM_BINARY_TYPE: {
      cl_program_binary_type t = pd->binary_type;
      if (t == CL_PROGRAM_BINARY_TYPE_NONE && p->from_binary) t = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
      return AnswerValue(size, value, size_ret, t);
    }
    default:
      return CL_INVALID_VALUE;
  }
}

// ---- kernels -----------------------------------------------------------------------------

cl_kernel CreateKernel(cl_program p, const char* name, cl_int* errcode_ret) {
  if (!Valid(p)) return SetErr(errcode_ret, CL_INVALID_PROGRAM), nullptr;
  if (!name) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  std::lock_guard lock(p->mu);
  if (std::none_of(p->per_device.begin(), p->per_device.end(), Built))
    return SetErr(errcode_ret, CL_INVALID_PROGRAM_EXECUTABLE), nullptr;
  cl_kernel k = MakeKernelLocked(p, name);
  SetErr(errcode_ret, k ? CL_SUCCESS : CL_INVALID_KERNEL_NAME);
  return k;
}

cl_int CreateKernelsInProgram(cl_program p, cl_uint num_kernels, cl_kernel* kernels, cl_uint* num_kernels_ret) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  std::lock_guard lock(p->mu);
  auto built = std::find_if(p->per_device.begin(), p->per_device.end(), Built);
  if (built == p->per_device.end()) return CL_INVALID_PROGRAM_EXECUTABLE;
  cl_uint n = static_cast<cl_uint>(built->functions.size());
  if (kernels && num_kernels < n) return CL_INVALID_VALUE;
  if (num_kernels_ret) *num_kernels_ret = n;
  if (!kernels) return CL_SUCCESS;
  std::vector<std::string> names;
  for (const auto& f : built->functions) names.push_back(f.name);
  for (cl_uint i = 0; i < n; ++i) kernels[i] = MakeKernelLocked(p, names[i]);
  return CL_SUCCESS;
}

cl_int RetainKernel(cl_kernel k) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  k->Retain();
  return CL_SUCCESS;
}

cl_int ReleaseKernel(cl_kernel k) {
  if (!Valid(k) || !k->Release()) return CL_INVALID_KERNEL;
  return CL_SUCCESS;
}

// Records one argument. The parameter's kind comes from the server; without it, a NULL
// value means local memory and a live Tandem cl_mem means a buffer.
cl_int SetKernelArg(cl_kernel k, cl_uint index, size_t size, const void* value) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  std::lock_guard lock(k->mu);
  if (index >= k->args.size()) return CL_INVALID_ARG_INDEX;
  // The server describes every parameter, but only arg info (a type name) makes the
  // kind trustworthy; without it every parameter reads as a plain value.
  const ir::ParamInfo* param = index < k->info.params.size() ? &k->info.params[index] : nullptr;
  if (param && param->type_name.empty()) param = nullptr;
  auto kind = param ? static_cast<ir::ParamKind>(param->kind) : ir::ParamKind::kValue;
  if (!param) {
    if (!value) {
      kind = ir::ParamKind::kLocal;
    } else if (size == sizeof(cl_mem)) {
      cl_mem m;
      std::memcpy(&m, value, sizeof m);
      if (Valid(m)) kind = ir::ParamKind::kGlobal;
    }
  }
  _cl_kernel::Arg arg;
  arg.set = true;
  switch (kind) {
    case ir::ParamKind::kGlobal:
    case ir::ParamKind::kConstant: {
      if (size != sizeof(cl_mem)) return CL_INVALID_ARG_SIZE;
      cl_mem m = nullptr;
      if (value) std::memcpy(&m, value, sizeof m);
      if (!m) {
        arg.kind = ir::ArgKind::kNullBuffer;
        break;
      }
      if (!Valid(m) || m->context != k->program->context) return CL_INVALID_MEM_OBJECT;
      arg.kind = ir::ArgKind::kBuffer;
      arg.mem = m;
      arg.value = m->remote();
      arg.offset = m->origin;
      arg.size = m->size;
      arg.ready = m->ready_event();
      break;
    }
    case ir::ParamKind::kLocal:
      if (value) return CL_INVALID_ARG_VALUE;
      if (size == 0) return CL_INVALID_ARG_SIZE;
      arg.kind = ir::ArgKind::kLocal;
      arg.value = size;
      break;
    case ir::ParamKind::kValue:
      if (!value) return CL_INVALID_ARG_VALUE;
      if (param && param->size && size != param->size) return CL_INVALID_ARG_SIZE;
      arg.kind = ir::ArgKind::kBytes;
      arg.data.assign(static_cast<const uint8_t*>(value), static_cast<const uint8_t*>(value) + size);
      break;
    case ir::ParamKind::kSampler:
      return CL_INVALID_SAMPLER;
    case ir::ParamKind::kImage:
      return CL_INVALID_MEM_OBJECT;
  }
  k->args[index] = std::move(arg);
  return CL_SUCCESS;
}

cl_int GetKernelInfo(cl_kernel k, cl_kernel_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  switch (param) {
    case CL_KERNEL_FUNCTION_NAME:
      return AnswerString(size, value, size_ret, k->name);
    case CL_KERNEL_NUM_ARGS:
      return AnswerValue(size, value, size_ret, k->info.num_params);
    case CL_KERNEL_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, k->refs.load());
    case CL_KERNEL_CONTEXT:
      return AnswerValue(size, value, size_ret, k->program->context);
    case CL_KERNEL_PROGRAM:
      return AnswerValue(size, value, size_ret, k->program);
    case CL_KERNEL_ATTRIBUTES: {
      std::string attrs;
      for (const auto& a : k->info.attrs)
        if (a.key == CL_KERNEL_ATTRIBUTES) attrs.assign(a.value.begin(), a.value.end());
      while (!attrs.empty() && attrs.back() == '\0') attrs.pop_back();
      return AnswerString(size, value, size_ret, attrs);
    }
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int GetKernelArgInfo(cl_kernel k, cl_uint index, cl_kernel_arg_info param, size_t size, void* value,
                        size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (index >= k->info.num_params) return CL_INVALID_ARG_INDEX;
  if (index >= k->info.params.size() || k->info.params[index].type_name.empty())
    return CL_KERNEL_ARG_INFO_NOT_AVAILABLE;
  const ir::ParamInfo& pi = k->info.params[index];
  switch (param) {
    case CL_KERNEL_ARG_ADDRESS_QUALIFIER: {
      cl_kernel_arg_address_qualifier q = CL_KERNEL_ARG_ADDRESS_PRIVATE;
      switch (static_cast<ir::ParamKind>(pi.kind)) {
        case ir::ParamKind::kGlobal: q = CL_KERNEL_ARG_ADDRESS_GLOBAL; break;
        case ir::ParamKind::kLocal: q = CL_KERNEL_ARG_ADDRESS_LOCAL; break;
        case ir::ParamKind::kConstant: q = CL_KERNEL_ARG_ADDRESS_CONSTANT; break;
        default: break;
      }
      return AnswerValue(size, value, size_ret, q);
    }
    case CL_KERNEL_ARG_ACCESS_QUALIFIER:  // the server's answer; NONE where it had none
      return AnswerValue(size, value, size_ret,
                         cl_kernel_arg_access_qualifier{pi.access ? pi.access : CL_KERNEL_ARG_ACCESS_NONE});
    case CL_KERNEL_ARG_TYPE_NAME:
      return AnswerString(size, value, size_ret, pi.type_name);
    case CL_KERNEL_ARG_TYPE_QUALIFIER:
      return AnswerValue(size, value, size_ret, cl_kernel_arg_type_qualifier{pi.type_qualifier});
    case CL_KERNEL_ARG_NAME:
      return AnswerString(size, value, size_ret, pi.name);
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int GetKernelWorkGroupInfo(cl_kernel k, cl_device_id device, cl_kernel_work_group_info param, size_t size,
                              void* value, size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (!device) {
    if (k->program->per_device.size() != 1) return CL_INVALID_DEVICE;
    device = k->program->per_device.front().device;
  }
  const ir::FunctionInfo* fi = k->InfoFor(device);
  if (!fi) return CL_INVALID_DEVICE;
  switch (param) {
    case CL_KERNEL_WORK_GROUP_SIZE:
      return AnswerValue(size, value, size_ret, static_cast<size_t>(fi->max_block));
    case CL_KERNEL_COMPILE_WORK_GROUP_SIZE: {
      size_t wg[3] = {0, 0, 0};
      for (size_t i = 0; i < 3 && i < fi->compile_block.size(); ++i) wg[i] = fi->compile_block[i];
      return Answer(size, value, size_ret, wg, sizeof wg);
    }
    case CL_KERNEL_LOCAL_MEM_SIZE: {
      // The kernel's own local memory plus the __local arguments set so far.
      cl_ulong total = fi->local_mem;
      std::lock_guard lock(k->mu);
      for (const auto& a : k->args)
        if (a.set && a.kind == ir::ArgKind::kLocal) total += a.value;
      return AnswerValue(size, value, size_ret, total);
    }
    case CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE:
      return AnswerValue(size, value, size_ret, static_cast<size_t>(fi->preferred_multiple));
    case CL_KERNEL_PRIVATE_MEM_SIZE:
      return AnswerValue(size, value, size_ret, cl_ulong{fi->private_mem});
    default:
      return CL_INVALID_VALUE;
  }
}

}  // namespace tandem::ocl

// ---- object members (the objects live in the global namespace, as cl.h declares them) ----

using namespace tandem::ocl;  // NOLINT: member bodies call the family helpers

_cl_program::PerDevice* _cl_program::For(cl_device_id d) {
  for (auto& pd : per_device)
    if (pd.device == d) return &pd;
  return nullptr;
}

_cl_program::~_cl_program() {
  for (const auto& pd : per_device)
    if (pd.loaded) pd.device->session().Post(tandem::ir::ModuleFreeReq{pd.module});
  context->Unhold();
}

const tandem::ir::FunctionInfo* _cl_kernel::InfoFor(cl_device_id d) const {
  for (const auto& [dev, fi] : device_info)
    if (dev == d) return &fi;
  return nullptr;
}

uint64_t _cl_kernel::FunctionFor(cl_device_id d) const {
  for (const auto& [dev, fn] : functions)
    if (dev == d) return fn;
  return 0;
}

_cl_kernel::~_cl_kernel() {
  for (const auto& [dev, fn] : functions) dev->session().Post(tandem::ir::FunctionFreeReq{fn});
  {
    std::lock_guard lock(program->mu);
    program->kernels--;
  }
  program->Unhold();
}
