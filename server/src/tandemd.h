// The two roles of the tandemd executable: the session broker (the process started by
// the user, listening on --listen) and the per-session worker it forks and execs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tandem/server/backend.h"
#include "tandem/status.h"

namespace tandem::server {

// Fault injection for tests and evaluation (--inject-*), handed from broker to workers.
struct InjectOptions {
  double bitflip_rate = 0;   // probability per read back of one flipped bit (data or digest)
  double bitflip_per_s = 0;  // or flips a second, a Poisson process (at the next read back)
  uint64_t stall_after = 0;  // 0: never; else stop answering anything after this many commands
  uint64_t exit_after = 0;   // 0: never; else the worker dies after this many commands
  uint64_t cut_bulk_every = 0;  // 0: never; else the worker drops the client's connection as
                                // every N-th bulk (RMA) transfer with it is under way
  bool any() const { return bitflip_rate > 0 || bitflip_per_s > 0 || stall_after || exit_after || cut_bulk_every; }
};

struct BrokerOptions {
  std::string listen;                // host:port
  std::optional<std::string> token;  // set when --token-file was given
  std::string backend = "auto";      // opencl | cuda | auto
  std::string devices;               // backend device filter
  std::chrono::milliseconds session_timeout{10000};
  // How long a session whose client's link broke is kept for the client to resume it.
  std::chrono::milliseconds session_grace{15000};
  uint32_t max_sessions = 64;        // live sessions at most; more Hellos get kOverload
  InjectOptions inject;
};

struct WorkerOptions {
  std::string backend;  // opencl | cuda | auto
  std::string devices;
  std::string bind_host;  // the broker's listen host; the worker listens on <host>:0
  std::chrono::milliseconds session_timeout{10000};
  std::chrono::milliseconds session_grace{15000};
  int status_fd = -1;     // the pipe the worker reports "ok <port> <kind> <name>" or "error <why>" on
  uint64_t session_key = 0;
  bool probe = false;     // only open the backend and report it (the broker's start-up check)
  bool fixed_layout = false;  // the client asked for address randomization off (kFeatureFixedLayout)
  InjectOptions inject;
};

// Environment variable that carries the session key from broker to worker (kept off the
// command line, which every local user can read in /proc).
inline constexpr const char* kSessionKeyEnv = "TANDEM_SESSION_KEY";

int RunBroker(const BrokerOptions& options);
int RunWorker(const WorkerOptions& options);

// Opens the backend `kind` names; "auto" is CUDA when it has a device, else OpenCL.
// `chosen` receives "cuda" or "opencl".
Result<std::unique_ptr<Backend>> OpenBackend(const std::string& kind, const BackendOptions& options,
                                             std::string* chosen);

}  // namespace tandem::server
