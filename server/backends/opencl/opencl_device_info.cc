// DeviceInfo: the raw clGetDeviceInfo / clGetPlatformInfo bytes of every parameter the
// device answers, keyed by the parameter's value. The OpenCL front end answers the
// program's clGetDeviceInfo / clGetPlatformInfo from exactly these bytes.
#include <fmt/format.h>

#include "opencl_backend.h"

namespace tandem::server::opencl {
namespace {

// Every cl_device_info that OpenCL 1.0-3.0 (and the cl_khr extensions in cl_ext.h)
// assigns lies in [CL_DEVICE_TYPE, CL_DEVICE_LATEST_CONFORMANCE_VERSION_PASSED]; values
// in between that a device does not know are refused by clGetDeviceInfo and skipped.
constexpr cl_device_info kFirstDeviceParam = CL_DEVICE_TYPE;                               // 0x1000
constexpr cl_device_info kLastDeviceParam = CL_DEVICE_LATEST_CONFORMANCE_VERSION_PASSED;  // 0x1072
// CL_PLATFORM_PROFILE .. CL_PLATFORM_EXTENSIONS_WITH_VERSION (0x0900..0x0907).
constexpr cl_platform_info kFirstPlatformParam = CL_PLATFORM_PROFILE;
constexpr cl_platform_info kLastPlatformParam = CL_PLATFORM_EXTENSIONS_WITH_VERSION;

// Handle-valued answers mean nothing in another process.
bool IsHandleValued(cl_device_info p) { return p == CL_DEVICE_PLATFORM || p == CL_DEVICE_PARENT_DEVICE; }

}  // namespace

Status OpenCLBackend::OnDeviceInfo(const ir::DeviceInfoReq& req, ir::DeviceInfoRep* rep) {
  auto d = DeviceAt(req.index);
  if (!d.ok()) return d.status();
  const Device& dev = *d.value();
  rep->api = static_cast<uint32_t>(Api::kOpenCL);
  rep->name = dev.name;
  rep->platform = dev.platform_name;
  for (cl_device_info p = kFirstDeviceParam; p <= kLastDeviceParam; ++p) {
    if (IsHandleValued(p)) continue;
    ir::Prop prop{static_cast<uint32_t>(p), {}};
    if (QueryBytes([&](size_t n, void* v, size_t* r) { return clGetDeviceInfo(dev.id, p, n, v, r); }, &prop.value) ==
        CL_SUCCESS)
      rep->props.push_back(std::move(prop));
  }
  for (cl_platform_info p = kFirstPlatformParam; p <= kLastPlatformParam; ++p) {
    ir::Prop prop{static_cast<uint32_t>(p), {}};
    if (QueryBytes([&](size_t n, void* v, size_t* r) { return clGetPlatformInfo(dev.platform, p, n, v, r); },
                   &prop.value) == CL_SUCCESS)
      rep->props.push_back(std::move(prop));
  }
  return Status::Ok();
}

}  // namespace tandem::server::opencl
