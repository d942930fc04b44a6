// CUDA's error model: a per-thread last error, sticky errors that stay with a device until
// it is reset, the runtime's own names and messages, and the translation of Tandem
// statuses and CUresult codes into cudaError_t at the API edge.
#include <string_view>

#include "frontend.h"

namespace tandem::cuda {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* message;
};
// The real runtime's table (errors.def is read from libcudart.so.13 by tools/gen_tables.py).
constexpr ErrorText kErrors[] = {
#define X(name, value, message) {static_cast<cudaError_t>(value), #name, message},
#include "errors.def"
#undef X
};

const ErrorText* Find(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.code == e) return &t;
  return nullptr;
}

}  // namespace

cudaError_t Return(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

// cudaError_t was laid out so that the driver's CUresult values carry over: a CUresult the
// runtime also knows keeps its number, anything else is cudaErrorUnknown.
cudaError_t FromCuResult(int32_t cu) {
  if (cu == 202 /* CUDA_ERROR_CONTEXT_ALREADY_CURRENT, deprecated */) return cudaSuccess;
  const ErrorText* t = Find(static_cast<cudaError_t>(cu));
  return t ? t->code : cudaErrorUnknown;
}

cudaError_t ToCuda(const Status& st) {
  switch (st.code()) {
    case Code::kOk: return cudaSuccess;
    case Code::kApiError:
      if (st.api() == Api::kCuda) return FromCuResult(st.native());
      return cudaErrorUnknown;
    case Code::kInvalidArgument: return cudaErrorInvalidValue;
    case Code::kUnknownHandle: return cudaErrorInvalidResourceHandle;
    case Code::kOutOfMemory: return cudaErrorMemoryAllocation;
    case Code::kUnimplemented: return cudaErrorNotSupported;
    case Code::kBuildFailed: return cudaErrorInvalidKernelImage;
    // The server or the link is gone: its devices are no longer available.
    case Code::kAuth:
    case Code::kLinkLost:
    case Code::kServerLost:
    case Code::kTimeout: return cudaErrorDevicesUnavailable;
    case Code::kProtocol:
    case Code::kOverload:
    case Code::kInternal: return cudaErrorUnknown;
  }
  return cudaErrorUnknown;
}

bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

cudaError_t Unsupported(const char* name) {
  log::Once(name);
  return Return(cudaErrorNotSupported);
}

// The sticky error of the calling thread's current device, if the device was ever set up.
static cudaError_t CurrentSticky() {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = f.Existing(CurrentIndex());
  return d ? d->sticky : cudaSuccess;
}

}  // namespace tandem::cuda

using namespace tandem::cuda;

TANDEM_API cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e != cudaSuccess ? e : CurrentSticky();
}

TANDEM_API cudaError_t cudaPeekAtLastError() {
  return t_last_error != cudaSuccess ? t_last_error : CurrentSticky();
}

TANDEM_API const char* cudaGetErrorName(cudaError_t e) {
  const ErrorText* t = Find(e);
  return t ? t->name : "cudaErrorUnknown";
}

TANDEM_API const char* cudaGetErrorString(cudaError_t e) {
  const ErrorText* t = Find(e);
  return t ? t->message : "unrecognized error code";
}
