// Everything about a command is generated here from the table in commands.def:
// the Opcode enum, NameReq / NameRep structs, their field visitors (used by the codec and
// the trace), per-command traits and the table of names and flags.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/ir/commands.def"

namespace tandem::ir {

inline constexpr uint32_t kMagic = 0x4D444E54;  // "TNDM" little-endian
// 2: server-to-server copies (Peer*); 3: AsyncError.stream and .waited, PriorityRange,
// ParamInfo.access and .type_qualifier.
inline constexpr uint32_t kProtocolVersion = 3;
inline constexpr uint64_t kFeatureRma = 1u << 0;      // client offers RMA regions for bulk data
inline constexpr uint64_t kFeatureOpenCL = 1u << 1;
inline constexpr uint64_t kFeatureCuda = 1u << 2;
// The client runs fault tolerance: its worker gets the same address-space layout on every run
// (randomization off), so that a module's globals land at the same device addresses on every
// replica and on a spare that takes a replica's place.
inline constexpr uint64_t kFeatureFixedLayout = 1u << 3;

// Limits every decoder enforces (a message above them is refused, not allocated).
inline constexpr uint32_t kMaxString = 1u << 20;        // 1 MiB (build logs, sources)
inline constexpr uint32_t kMaxBytes = 256u << 20;       // inline data / module images
inline constexpr uint32_t kMaxListItems = 1u << 16;
inline constexpr size_t kInlineDataLimit = 64 * 1024;   // above this, bulk data goes by RMA
// Warm (keepalive): which paths to exercise.
inline constexpr uint32_t kWarmCopy = 1;    // a small copy to the device and back
inline constexpr uint32_t kWarmKernel = 2;  // an empty kernel
inline constexpr size_t kWarmMaxBytes = 64;

// ModuleCompile's header names: relative paths of plain components (no empty, "." or ".."
// component, no leading '/', no backslash or control character). PoCL writes each header to a
// file of that name under its temporary folder, so servers refuse any other name.
inline bool SafeIncludeName(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  for (size_t start = 0; start <= name.size();) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
    start = end + 1;
  }
  return true;
}

// ---- field types ---------------------------------------------------------------------
using u8 = uint8_t;
using u16 = uint16_t;
using u32 = uint32_t;
using u64 = uint64_t;
using i32 = int32_t;
using i64 = int64_t;
using f64 = double;
using str = std::string;
using bytes = std::vector<uint8_t>;
using u64s = std::vector<uint64_t>;
using i32s = std::vector<int32_t>;

#define TANDEM_UNPAREN(...) __VA_ARGS__

// ---- nested structs: declared in table order, each may use the ones before it ---------
struct Prop;
struct Region;
struct ParamInfo;
struct FunctionInfo;
struct LaunchArg;
struct AsyncError;
using PropList = std::vector<Prop>;
using ParamList = std::vector<ParamInfo>;
using ArgList = std::vector<LaunchArg>;
using FuncList = std::vector<FunctionInfo>;

#define F(type, name) type name{};
#define S(Name, fields) \
  struct Name {         \
    TANDEM_UNPAREN fields \
  };
TANDEM_IR_STRUCTS(S)
#undef S

// ---- opcodes ---------------------------------------------------------------------------
enum class Opcode : uint16_t {
#define X(op, Name, flags, req, rep) k##Name = op,
  TANDEM_IR_COMMANDS(X)
#undef X
};

enum Flags : uint32_t {
  kNeedsReply = 1u << 0,
  kAsync = 1u << 1,
  kBulk = 1u << 2,
  kWritesDevice = 1u << 3,
  kLogged = 1u << 4,
  kBroker = 1u << 5,
  kUrgent = 1u << 6,
  kPeer = 1u << 7,
};

// ---- request / reply structs -------------------------------------------------------------
#define X(op, Name, flags_, req, rep)                                      \
  struct Name##Rep {                                                       \
    TANDEM_UNPAREN rep                                                     \
  };                                                                       \
  struct Name##Req {                                                       \
    static constexpr Opcode kOpcode = Opcode::k##Name;                     \
    static constexpr uint32_t kFlags = (flags_);                           \
    static constexpr std::string_view kName = #Name;                       \
    using Reply = Name##Rep;                                               \
    TANDEM_UNPAREN req                                                     \
  };
TANDEM_IR_COMMANDS(X)
#undef X
#undef F

// ---- field visitors: v(field, "name") for each field, in wire order ----------------------
#define F(type, name) v(s.name, #name);
#define S(Name, fields)                          \
  template <class V>                             \
  void VisitFields(Name& s, V& v) {              \
    TANDEM_UNPAREN fields                        \
  }                                              \
  template <class V>                             \
  void VisitFields(const Name& s, V& v) {        \
    TANDEM_UNPAREN fields                        \
  }
TANDEM_IR_STRUCTS(S)
#undef S
#define X(op, Name, flags, req, rep)                                          \
  template <class V>                                                          \
  void VisitFields([[maybe_unused]] Name##Req& s, [[maybe_unused]] V& v) {    \
    TANDEM_UNPAREN req                                                        \
  }                                                                           \
  template <class V>                                                          \
  void VisitFields([[maybe_unused]] const Name##Req& s, [[maybe_unused]] V& v) { \
    TANDEM_UNPAREN req                                                        \
  }                                                                           \
  template <class V>                                                          \
  void VisitFields([[maybe_unused]] Name##Rep& s, [[maybe_unused]] V& v) {    \
    TANDEM_UNPAREN rep                                                        \
  }                                                                           \
  template <class V>                                                          \
  void VisitFields([[maybe_unused]] const Name##Rep& s, [[maybe_unused]] V& v) { \
    TANDEM_UNPAREN rep                                                        \
  }
TANDEM_IR_COMMANDS(X)
#undef X
#undef F

// ---- the command table at run time (names and flags by opcode) --------------------------
struct CommandInfo {
  Opcode opcode;
  std::string_view name;
  uint32_t flags;
};
inline constexpr CommandInfo kCommands[] = {
#define X(op, Name, flags, req, rep) {Opcode::k##Name, #Name, (flags)},
    TANDEM_IR_COMMANDS(X)
#undef X
};
inline constexpr size_t kCommandCount = sizeof(kCommands) / sizeof(kCommands[0]);

// Returns nullptr for an opcode the table does not know.
const CommandInfo* FindCommand(uint16_t opcode);
std::string_view CommandName(uint16_t opcode);

// Calls f.template operator()<NameReq>() for every command (used to build dispatch tables).
template <class Fn>
void ForEachCommand(Fn&& f) {
#define X(op, Name, flags, req, rep) f.template operator()<Name##Req>();
  TANDEM_IR_COMMANDS(X)
#undef X
}

// ---- API-neutral enums carried in fields --------------------------------------------------
// LaunchArg kinds. kBuffer: value = buffer handle; data empty (the whole buffer) or
// SubRange(origin, size) (an OpenCL sub-buffer of that range, as clCreateSubBuffer makes).
enum class ArgKind : uint32_t { kBytes = 0, kBuffer = 1, kLocal = 2, kNullBuffer = 3 };
inline bytes SubRange(uint64_t origin, uint64_t size) {
  bytes b(16);
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(origin >> (8 * i));
    b[8 + i] = static_cast<uint8_t>(size >> (8 * i));
  }
  return b;
}
inline bool ParseSubRange(const bytes& b, uint64_t* origin, uint64_t* size) {
  if (b.size() != 16) return false;
  *origin = *size = 0;
  for (int i = 0; i < 8; ++i) {
    *origin |= static_cast<uint64_t>(b[i]) << (8 * i);
    *size |= static_cast<uint64_t>(b[8 + i]) << (8 * i);
  }
  return true;
}
enum class ParamKind : uint32_t { kValue = 0, kGlobal = 1, kLocal = 2, kConstant = 3, kSampler = 4, kImage = 5 };
enum class ModuleKind : uint32_t { kOpenCLSource = 1, kOpenCLBinary = 2, kCudaImage = 3 };
enum StreamFlags : uint32_t { kStreamProfiling = 1, kStreamOutOfOrder = 2, kStreamNonBlocking = 4 };
enum EventFlags : uint32_t { kEventUser = 1, kEventTiming = 2, kEventBlockingSync = 4 };
// Event status values follow OpenCL's (CL_COMPLETE = 0 ... CL_QUEUED = 3; negative = error).
// A failed command's status says what failed, unambiguously: an OpenCL error is its own
// (negative) cl_int, a CUDA one minus its CUresult, and a failure with no native code
// -(kEventFailedTandem + Code).
enum EventStatus : int32_t { kEventComplete = 0, kEventRunning = 1, kEventSubmitted = 2, kEventQueued = 3 };
inline constexpr int32_t kEventFailedTandem = 100000;
enum BufferFlags : uint64_t { kBufferReadOnly = 1, kBufferWriteOnly = 2, kBufferHostAccessible = 4 };
enum LaunchFlags : uint32_t { kLaunchCooperative = 1 };

// Device property keys (DeviceInfoRep::props). OpenCL backends use the cl_device_info value
// itself (0x1000..) and cl_platform_info (0x0900..) for their platform. CUDA backends use:
inline constexpr uint32_t kCudaAttrBase = 0x10000;       // + CUdevice_attribute: int32 value
inline constexpr uint32_t kCudaTotalMem = 0x20001;       // u64 bytes
inline constexpr uint32_t kCudaUuid = 0x20002;           // 16 bytes
inline constexpr uint32_t kCudaDriverVersion = 0x20003;  // int32 (cuDriverGetVersion)
inline constexpr uint32_t kCudaLuid = 0x20004;           // 8 bytes + u32 node mask (may be absent)
inline constexpr uint32_t kCudaPciBusId = 0x20005;       // cuDeviceGetPCIBusId's string, no NUL (may be absent)
// Function attribute keys (FunctionInfo::attrs) for CUDA: kCudaFuncAttrBase + CUfunction_attribute (int32).
inline constexpr uint32_t kCudaFuncAttrBase = 0x30000;

// Client-owned device virtual address space for CUDA (DESIGN.md: pointer-stable memory).
// Virtual device i owns [kCudaVaBase + i * kCudaVaPerDevice, + kCudaVaPerDevice).
inline constexpr uint64_t kCudaVaBase = 0x200000000000ull;
inline constexpr uint64_t kCudaVaPerDevice = 0x4000000000ull;  // 256 GiB

}  // namespace tandem::ir
