// The Tandem platform and its devices. Device info is answered on the client from the
// properties each server sent (key = cl_device_info, value = the remote answer's bytes);
// only what Tandem itself decides is overridden: identity, OpenCL 1.2, no images, no SVM,
// no sub-devices, and the extensions that work through Tandem.
#include <algorithm>
#include <cstdlib>

#include "objects.h"

namespace tandem::ocl {
namespace {

// Platform strings the server sends with each device (not cl_device_info keys).
constexpr uint32_t kFirstDeviceKey = 0x1000;

std::string PropString(const std::vector<uint8_t>& v) {
  std::string s(v.begin(), v.end());
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// Kernel-language extensions: they only change what the remote compiler accepts, so they
// work through Tandem. Host-API extensions are dropped unless Tandem implements them.
bool KeepExtension(std::string_view e) {
  static constexpr std::string_view kKeep[] = {
      "cl_khr_fp64",
      "cl_khr_fp16",
      "cl_khr_int64_base_atomics",
      "cl_khr_int64_extended_atomics",
      "cl_khr_global_int32_base_atomics",
      "cl_khr_global_int32_extended_atomics",
      "cl_khr_local_int32_base_atomics",
      "cl_khr_local_int32_extended_atomics",
      "cl_khr_byte_addressable_store",
      "cl_khr_integer_dot_product",
      "cl_khr_extended_bit_ops",
      "cl_khr_expect_assume",
      "cl_khr_kernel_clock",
      "cl_khr_work_group_uniform_arithmetic",
  };
  if (std::find(std::begin(kKeep), std::end(kKeep), e) != std::end(kKeep)) return true;
  // cl_khr_subgroup_ballot, _shuffle, ... are kernel built-ins (cl_khr_subgroups is not).
  return e.starts_with("cl_khr_subgroup_");
}

std::string FilterExtensions(const std::string& list) {
  std::string out;
  size_t i = 0;
  while (i < list.size()) {
    size_t j = list.find(' ', i);
    if (j == std::string::npos) j = list.size();
    std::string_view e(list.data() + i, j - i);
    if (!e.empty() && KeepExtension(e)) {
      if (!out.empty()) out += ' ';
      out += e;
    }
    i = j + 1;
  }
  return out;
}

// "OpenCL 3.0 PoCL 3.1 ..." -> "PoCL 3.1 ...": the text after "<prefix>x.y ".
std::string AfterVersion(const std::string& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return s;
  size_t sp = s.find(' ', prefix.size());
  return sp == std::string::npos ? std::string() : s.substr(sp + 1);
}

// The x.y after prefix, as 10*x+y (0 if absent).
int VersionOf(const std::string& s, std::string_view prefix) {
  if (!s.starts_with(prefix) || s.size() < prefix.size() + 3) return 0;
  char major = s[prefix.size()], minor = s[prefix.size() + 2];
  if (major < '0' || major > '9' || minor < '0' || minor > '9') return 0;
  return (major - '0') * 10 + (minor - '0');
}

class InfoBuilder {
 public:
  explicit InfoBuilder(_cl_device_id* d) : d_(d) {}
  bool Has(cl_device_info k) const { return d_->info.count(k) != 0; }
  std::string String(cl_device_info k) const { return Has(k) ? PropString(d_->info.at(k)) : std::string(); }
  template <class T>
  T Value(cl_device_info k, T fallback) const {
    auto it = d_->info.find(k);
    T v = fallback;
    if (it != d_->info.end() && it->second.size() == sizeof(T)) std::memcpy(&v, it->second.data(), sizeof(T));
    return v;
  }
  template <class T>
  void Set(cl_device_info k, const T& v) {
    auto* p = reinterpret_cast<const uint8_t*>(&v);
    d_->info[k].assign(p, p + sizeof(T));
  }
  template <class T>
  void SetIfPresent(cl_device_info k, const T& v) {
    if (Has(k)) Set(k, v);
  }
  void SetString(cl_device_info k, const std::string& s) {
    d_->info[k].assign(s.begin(), s.end());
    d_->info[k].push_back('\0');
  }
  template <class T>
  void SetArray(cl_device_info k, const std::vector<T>& v) {
    auto* p = reinterpret_cast<const uint8_t*>(v.data());
    d_->info[k].assign(p, p + v.size() * sizeof(T));
  }

 private:
  _cl_device_id* d_;
};

// Builds one device's answers from the server's properties.
std::unique_ptr<_cl_device_id> MakeDevice(client::Device* remote) {
  auto d = std::make_unique<_cl_device_id>();
  d->remote = remote;
  for (const auto& p : remote->info.props)
    if (p.key >= kFirstDeviceKey) d->info[p.key] = p.value;
  InfoBuilder b(d.get());

  // Identity: our platform, a root device, never released.
  b.Set(CL_DEVICE_PLATFORM, ThePlatform());
  b.Set(CL_DEVICE_PARENT_DEVICE, cl_device_id{nullptr});
  b.Set(CL_DEVICE_REFERENCE_COUNT, cl_uint{1});

  // Tandem implements OpenCL 1.2 semantics on the host side.
  std::string version = b.String(CL_DEVICE_VERSION);
  b.SetString(CL_DEVICE_VERSION, "OpenCL 1.2 " + AfterVersion(version, "OpenCL "));
  std::string c_version = b.String(CL_DEVICE_OPENCL_C_VERSION);
  if (VersionOf(c_version, "OpenCL C ") > 12)
    b.SetString(CL_DEVICE_OPENCL_C_VERSION, "OpenCL C 1.2 " + AfterVersion(c_version, "OpenCL C "));
  b.SetIfPresent(CL_DEVICE_NUMERIC_VERSION, cl_version{CL_MAKE_VERSION(1, 2, 0)});
  b.SetString(CL_DEVICE_EXTENSIONS, FilterExtensions(b.String(CL_DEVICE_EXTENSIONS)));
  // The cl_name_version arrays keep only what Tandem passes on.
  auto filter = [&](cl_device_info param, auto keep) {
    if (!b.Has(param)) return;
    const auto& raw = d->info[param];
    std::vector<cl_name_version> kept;
    for (size_t off = 0; off + sizeof(cl_name_version) <= raw.size(); off += sizeof(cl_name_version)) {
      cl_name_version nv;
      std::memcpy(&nv, raw.data() + off, sizeof nv);
      if (keep(nv)) kept.push_back(nv);
    }
    b.SetArray(param, kept);
  };
  filter(CL_DEVICE_EXTENSIONS_WITH_VERSION, [](const cl_name_version& nv) {
    return KeepExtension(std::string_view(nv.name, strnlen(nv.name, sizeof nv.name)));
  });
  filter(CL_DEVICE_OPENCL_C_ALL_VERSIONS,
         [](const cl_name_version& nv) { return nv.version <= CL_MAKE_VERSION(1, 2, 0); });

  // No images or samplers.
  b.Set(CL_DEVICE_IMAGE_SUPPORT, cl_bool{CL_FALSE});
  for (cl_device_info k : {CL_DEVICE_MAX_READ_IMAGE_ARGS, CL_DEVICE_MAX_WRITE_IMAGE_ARGS, CL_DEVICE_MAX_SAMPLERS})
    b.Set(k, cl_uint{0});
  for (cl_device_info k : {CL_DEVICE_IMAGE2D_MAX_WIDTH, CL_DEVICE_IMAGE2D_MAX_HEIGHT, CL_DEVICE_IMAGE3D_MAX_WIDTH,
                           CL_DEVICE_IMAGE3D_MAX_HEIGHT, CL_DEVICE_IMAGE3D_MAX_DEPTH, CL_DEVICE_IMAGE_MAX_BUFFER_SIZE,
                           CL_DEVICE_IMAGE_MAX_ARRAY_SIZE})
    b.Set(k, size_t{0});
  for (cl_device_info k : {CL_DEVICE_MAX_READ_WRITE_IMAGE_ARGS, CL_DEVICE_IMAGE_PITCH_ALIGNMENT,
                           CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT})
    b.SetIfPresent(k, cl_uint{0});

  // Host-side features Tandem does not implement: SVM, native kernels, sub-devices,
  // separate compile/link, built-in kernels, IL, on-device queues, pipes. Memory is not
  // unified with the host: it lives on a server.
  b.Set(CL_DEVICE_SVM_CAPABILITIES, cl_device_svm_capabilities{0});
  b.Set(CL_DEVICE_EXECUTION_CAPABILITIES, cl_device_exec_capabilities{CL_EXEC_KERNEL});
  b.Set(CL_DEVICE_HOST_UNIFIED_MEMORY, cl_bool{CL_FALSE});
  b.Set(CL_DEVICE_PARTITION_MAX_SUB_DEVICES, cl_uint{0});
  b.SetArray(CL_DEVICE_PARTITION_PROPERTIES, std::vector<cl_device_partition_property>{0});
  b.Set(CL_DEVICE_PARTITION_AFFINITY_DOMAIN, cl_device_affinity_domain{0});
  b.SetArray(CL_DEVICE_PARTITION_TYPE, std::vector<cl_device_partition_property>{});
  b.Set(CL_DEVICE_LINKER_AVAILABLE, cl_bool{CL_FALSE});
  b.SetString(CL_DEVICE_BUILT_IN_KERNELS, "");
  if (b.Has(CL_DEVICE_BUILT_IN_KERNELS_WITH_VERSION)) b.SetArray(CL_DEVICE_BUILT_IN_KERNELS_WITH_VERSION, std::vector<cl_name_version>{});
  if (b.Has(CL_DEVICE_IL_VERSION)) b.SetString(CL_DEVICE_IL_VERSION, "");
  if (b.Has(CL_DEVICE_ILS_WITH_VERSION)) b.SetArray(CL_DEVICE_ILS_WITH_VERSION, std::vector<cl_name_version>{});
  b.SetIfPresent(CL_DEVICE_QUEUE_ON_DEVICE_PROPERTIES, cl_command_queue_properties{0});
  for (cl_device_info k : {CL_DEVICE_QUEUE_ON_DEVICE_PREFERRED_SIZE, CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE,
                           CL_DEVICE_MAX_ON_DEVICE_QUEUES, CL_DEVICE_MAX_ON_DEVICE_EVENTS, CL_DEVICE_MAX_PIPE_ARGS})
    b.SetIfPresent(k, cl_uint{0});
  b.SetIfPresent(CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES, cl_device_device_enqueue_capabilities{0});
  b.SetIfPresent(CL_DEVICE_PIPE_SUPPORT, cl_bool{CL_FALSE});

  // Limits used to validate calls on the client.
  d->type = b.Value(CL_DEVICE_TYPE, cl_device_type{CL_DEVICE_TYPE_GPU});
  d->max_work_group = b.Value(CL_DEVICE_MAX_WORK_GROUP_SIZE, size_t{0});
  d->max_alloc = b.Value(CL_DEVICE_MAX_MEM_ALLOC_SIZE, cl_ulong{0});
  d->base_align_bits = b.Value(CL_DEVICE_MEM_BASE_ADDR_ALIGN, cl_uint{8});
  d->queue_props = b.Value(CL_DEVICE_QUEUE_PROPERTIES,
                           cl_command_queue_properties{CL_QUEUE_PROFILING_ENABLE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE});
  if (auto it = d->info.find(CL_DEVICE_MAX_WORK_ITEM_SIZES); it != d->info.end()) {
    d->max_item_sizes.resize(it->second.size() / sizeof(size_t));
    std::memcpy(d->max_item_sizes.data(), it->second.data(), d->max_item_sizes.size() * sizeof(size_t));
  }
  return d;
}

struct DeviceList {
  std::once_flag once;
  std::vector<cl_device_id> ids;
};
DeviceList& Devices() {
  static DeviceList* list = new DeviceList;  // devices live as long as the process
  return *list;
}

}  // namespace

cl_platform_id ThePlatform() {
  static _cl_platform_id platform;
  return &platform;
}

const std::vector<cl_device_id>& PlatformDevices() {
  DeviceList& list = Devices();
  std::call_once(list.once, [&list] {
    const char* servers = std::getenv("TANDEM_SERVERS");
    auto& rt = client::Runtime::Get();
    if (!rt.status().ok()) {
      log::Warn("OpenCL: no Tandem server answered (TANDEM_SERVERS={}): {}; the Tandem platform has no devices",
                servers ? servers : "", rt.status().ToString());
      return;
    }
    for (client::Device* d : rt.Devices(Api::kOpenCL)) list.ids.push_back(MakeDevice(d).release());
    if (list.ids.empty())
      log::Warn("OpenCL: the Tandem servers ({}) offer no OpenCL device", servers ? servers : "");
  });
  return list.ids;
}

bool ValidDevice(cl_device_id d) {
  if (!d) return false;
  const auto& ids = PlatformDevices();
  return std::find(ids.begin(), ids.end(), d) != ids.end();
}

cl_int GetPlatformInfo(cl_platform_id platform, cl_platform_info param, size_t size, void* value, size_t* size_ret) {
  if (platform && platform != ThePlatform()) return CL_INVALID_PLATFORM;
  switch (param) {
    case CL_PLATFORM_PROFILE:
      return AnswerString(size, value, size_ret, "FULL_PROFILE");
    case CL_PLATFORM_VERSION:
      return AnswerString(size, value, size_ret, "OpenCL 1.2 Tandem 0.1");
    case CL_PLATFORM_NAME:
      return AnswerString(size, value, size_ret, "Tandem");
    case CL_PLATFORM_VENDOR:
      return AnswerString(size, value, size_ret, "Tandem");
    case CL_PLATFORM_EXTENSIONS:
      return AnswerString(size, value, size_ret, "cl_khr_icd");
    case CL_PLATFORM_ICD_SUFFIX_KHR:
      return AnswerString(size, value, size_ret, "TDM");
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int GetDeviceIDs(cl_platform_id platform, cl_device_type type, cl_uint num_entries, cl_device_id* devices,
                    cl_uint* num_devices) {
  if (platform && platform != ThePlatform()) return CL_INVALID_PLATFORM;
  constexpr cl_device_type kKnown = CL_DEVICE_TYPE_DEFAULT | CL_DEVICE_TYPE_CPU | CL_DEVICE_TYPE_GPU |
                                    CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CUSTOM;
  if (type != CL_DEVICE_TYPE_ALL && (type & ~kKnown || type == 0)) return CL_INVALID_DEVICE_TYPE;
  if ((num_entries == 0 && devices) || (!devices && !num_devices)) return CL_INVALID_VALUE;
  std::vector<cl_device_id> match;
  for (cl_device_id d : PlatformDevices()) {
    bool is_default = match.empty() && (type & CL_DEVICE_TYPE_DEFAULT);
    if (type == CL_DEVICE_TYPE_ALL || is_default || (type & d->type & ~CL_DEVICE_TYPE_DEFAULT)) match.push_back(d);
  }
  if (num_devices) *num_devices = static_cast<cl_uint>(match.size());
  if (match.empty()) return CL_DEVICE_NOT_FOUND;
  if (devices)
    for (size_t i = 0; i < match.size() && i < num_entries; ++i) devices[i] = match[i];
  return CL_SUCCESS;
}

cl_int GetDeviceInfo(cl_device_id device, cl_device_info param, size_t size, void* value, size_t* size_ret) {
  if (!ValidDevice(device)) return CL_INVALID_DEVICE;
  auto it = device->info.find(param);
  if (it == device->info.end()) return CL_INVALID_VALUE;
  return Answer(size, value, size_ret, it->second.data(), it->second.size());
}

// Root devices are never released.
cl_int RetainDevice(cl_device_id device) { return ValidDevice(device) ? CL_SUCCESS : CL_INVALID_DEVICE; }
cl_int ReleaseDevice(cl_device_id device) { return ValidDevice(device) ? CL_SUCCESS : CL_INVALID_DEVICE; }

}  // namespace tandem::ocl
