// The dispatch table, generated from entries.def, the stubs of unsupported entry points,
// the three exported symbols the ICD loader looks for, and the status mapping used at
// the API edge by every family file.
#include <cstdlib>
#include <tuple>

#include "objects.h"

#define TANDEM_CL_EXPORT extern "C" __attribute__((visibility("default")))

namespace tandem::ocl {
namespace {

// An unsupported entry point: the API's own error, logged once by name. Creators return
// NULL and set *errcode_ret (their last parameter).
template <class Fn, cl_int kErr, const char* kName>
struct Unsupported;

template <class R, class... A, cl_int kErr, const char* kName>
struct Unsupported<R(CL_API_CALL*)(A...), kErr, kName> {
  static R CL_API_CALL Call(A... args) {
    log::Once(kName);
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (std::is_same_v<R, cl_int>) {
      return kErr;
    } else {
      if constexpr (sizeof...(A) > 0) {
        constexpr size_t kLast = sizeof...(A) - 1;
        if constexpr (std::is_same_v<std::tuple_element_t<kLast, std::tuple<A...>>, cl_int*>) {
          SetErr(std::get<kLast>(std::forward_as_tuple(args...)), kErr);
        }
      }
      return nullptr;
    }
  }
};

// Linux headers declare the Direct3D / DX9 slots as plain void*.
template <cl_int kErr, const char* kName>
struct Unsupported<void*, kErr, kName> {
  static cl_int CL_API_CALL Call() {
    log::Once(kName);
    return kErr;
  }
};

template <class Fn, cl_int kErr, const char* kName>
Fn Slot() {
  if constexpr (std::is_same_v<Fn, void*>) {
    return reinterpret_cast<void*>(&Unsupported<void*, kErr, kName>::Call);
  } else {
    return &Unsupported<Fn, kErr, kName>::Call;
  }
}

// Names for the log, one per unsupported entry.
#define I(Name)
#define U(Name, err) constexpr char kName##Name[] = "cl" #Name;
#include "entries.def"
#undef I
#undef U

constexpr size_t kEntryCount = 0
#define I(Name) +1
#define U(Name, err) +1
#include "entries.def"
#undef I
#undef U
    ;
static_assert(sizeof(cl_icd_dispatch) == kEntryCount * sizeof(void*),
              "entries.def must name every slot of cl_icd_dispatch");

bool PlatformEnabled() {
  const char* servers = std::getenv("TANDEM_SERVERS");
  return servers && *servers;
}

}  // namespace

// Designated initialisers in declaration order: a missing or misplaced entry is an error.
const cl_icd_dispatch kDispatch = {
#define I(Name) .cl##Name = &Name,
#define U(Name, err) .cl##Name = Slot<cl_api_cl##Name, err, kName##Name>(),
#include "entries.def"
#undef I
#undef U
};

void WarnOnce(std::string msg) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard lock(mu);
    if (!seen.insert(msg).second) return;
  }
  log::Warn("{}", msg);
}

cl_int ToCl(const Status& st, std::string_view call, cl_int unknown_handle) {
  if (st.ok()) return CL_SUCCESS;
  if (st.code() == Code::kApiError && st.api() == Api::kOpenCL && st.native() < 0) return st.native();
  switch (st.code()) {
    case Code::kUnknownHandle:
      return unknown_handle;
    case Code::kOutOfMemory:
      return CL_MEM_OBJECT_ALLOCATION_FAILURE;
    case Code::kInvalidArgument:
      return CL_INVALID_VALUE;
    case Code::kUnimplemented:
      WarnOnce(fmt::format("OpenCL: {}: not supported by the server: {}", call, st.message()));
      return CL_INVALID_OPERATION;
    case Code::kBuildFailed:
      return CL_BUILD_PROGRAM_FAILURE;
    case Code::kLinkLost:
    case Code::kServerLost:
    case Code::kTimeout:
      WarnOnce(fmt::format("OpenCL: {}: the Tandem server is unreachable ({}); returning CL_OUT_OF_RESOURCES",
                           call, st.ToString()));
      return CL_OUT_OF_RESOURCES;
    default:
      WarnOnce(fmt::format("OpenCL: {}: {}", call, st.ToString()));
      return CL_OUT_OF_RESOURCES;
  }
}

// The platform list: empty unless TANDEM_SERVERS names servers, so an installed Tandem
// ICD never disturbs programs that do not use it.
cl_int GetPlatformIDs(cl_uint num_entries, cl_platform_id* platforms, cl_uint* num_platforms) {
  if ((num_entries == 0 && platforms) || (!platforms && !num_platforms)) return CL_INVALID_VALUE;
  cl_uint n = PlatformEnabled() ? 1 : 0;
  if (num_platforms) *num_platforms = n;
  if (n == 0) return CL_PLATFORM_NOT_FOUND_KHR;
  if (platforms) platforms[0] = ThePlatform();
  return CL_SUCCESS;
}

// Only the functions cl_khr_icd says a loader asks for: ocl-icd takes clGetPlatformInfo from
// here when it is not an exported symbol. Tandem implements no other extension functions.
void* GetExtensionFunctionAddress(const char* name) {
  if (!name) return nullptr;
  std::string_view n(name);
  if (n == "clIcdGetPlatformIDsKHR") return reinterpret_cast<void*>(&GetPlatformIDs);
  if (n == "clGetPlatformInfo") return reinterpret_cast<void*>(&GetPlatformInfo);
  return nullptr;
}

void* GetExtensionFunctionAddressForPlatform(cl_platform_id platform, const char* name) {
  if (platform != ThePlatform()) return nullptr;
  return GetExtensionFunctionAddress(name);
}

// The compiler is remote: unloading it is a hint with nothing to do.
cl_int UnloadCompiler() { return CL_SUCCESS; }
cl_int UnloadPlatformCompiler(cl_platform_id platform) {
  return platform == ThePlatform() ? CL_SUCCESS : CL_INVALID_PLATFORM;
}

}  // namespace tandem::ocl

// ---- the only exported symbols (exports.map) -----------------------------------------------

TANDEM_CL_EXPORT void* CL_API_CALL clGetExtensionFunctionAddress(const char* name) {
  return tandem::ocl::GetExtensionFunctionAddress(name);
}

TANDEM_CL_EXPORT void* CL_API_CALL clGetExtensionFunctionAddressForPlatform(cl_platform_id platform,
                                                                            const char* name) {
  return tandem::ocl::GetExtensionFunctionAddressForPlatform(platform, name);
}

TANDEM_CL_EXPORT cl_int CL_API_CALL clIcdGetPlatformIDsKHR(cl_uint num_entries, cl_platform_id* platforms,
                                                          cl_uint* num_platforms) {
  return tandem::ocl::GetPlatformIDs(num_entries, platforms, num_platforms);
}
