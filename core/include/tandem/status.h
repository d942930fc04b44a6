// One status type for all of Tandem. Its category drives recovery (STYLE.md point 7):
// an API error goes to the program, a lost link is reconnected, a lost server is failed
// over, unimplemented becomes the API's "not supported". Front ends translate to
// cudaError_t / cl_int only at the API edge.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace tandem {

enum class Code : uint32_t {
  kOk = 0,
  kApiError = 1,         // the backend API failed; native() holds its own code (cl_int / CUresult)
  kInvalidArgument = 2,  // bad field: out of range copy, bad size, bad flags
  kUnknownHandle = 3,    // handle not owned by this session
  kOutOfMemory = 4,
  kUnimplemented = 5,    // the server or backend does not support this command
  kProtocol = 6,         // malformed or truncated message, wrong magic or version
  kAuth = 7,             // wrong or missing token
  kLinkLost = 8,         // the connection failed; the server may still be alive
  kServerLost = 9,       // the server is gone or frozen
  kTimeout = 10,
  kOverload = 11,
  kBuildFailed = 12,     // module build failed; the log is in the reply
  kInternal = 13,
};

const char* CodeName(Code c);

// API tag for native codes, so a front end only trusts codes from its own API.
enum class Api : uint32_t { kNone = 0, kOpenCL = 1, kCuda = 2 };

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message, int32_t native = 0, Api api = Api::kNone)
      : code_(code), native_(native), api_(api), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status Invalid(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status Protocol(std::string m) { return {Code::kProtocol, std::move(m)}; }
  static Status Unknown(std::string m) { return {Code::kUnknownHandle, std::move(m)}; }
  static Status Native(Api api, int32_t native, std::string m) {
    return {Code::kApiError, std::move(m), native, api};
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int32_t native() const { return native_; }
  Api api() const { return api_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // True for failures that mean "the server or link is gone", not "the call was wrong".
  bool IsTransport() const {
    return code_ == Code::kLinkLost || code_ == Code::kServerLost || code_ == Code::kTimeout;
  }

 private:
  Code code_ = Code::kOk;
  int32_t native_ = 0;
  Api api_ = Api::kNone;
  std::string message_;
};

// A value or the status that explains its absence.
template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return value_; }
  T&& value() && { return std::move(value_); }
  const T& value() const& { return value_; }
  T* operator->() { return &value_; }
  T& operator*() { return value_; }

 private:
  Status status_;
  T value_{};
};

#define TANDEM_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::tandem::Status _st = (expr);          \
    if (!_st.ok()) return _st;              \
  } while (0)

}  // namespace tandem
