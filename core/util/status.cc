#include "tandem/status.h"

#include <fmt/format.h>

namespace tandem {

const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kApiError: return "api error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kUnknownHandle: return "unknown handle";
    case Code::kOutOfMemory: return "out of memory";
    case Code::kUnimplemented: return "unimplemented";
    case Code::kProtocol: return "protocol error";
    case Code::kAuth: return "authentication failed";
    case Code::kLinkLost: return "link lost";
    case Code::kServerLost: return "server lost";
    case Code::kTimeout: return "timeout";
    case Code::kOverload: return "overload";
    case Code::kBuildFailed: return "build failed";
    case Code::kInternal: return "internal error";
  }
  return "unknown status";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s = fmt::format("{}: {}", CodeName(code_), message_);
  if (code_ == Code::kApiError) s += fmt::format(" (native {})", native_);
  return s;
}

}  // namespace tandem
