// tandemd: serves the GPUs of this node to Tandem clients. See ../README.md.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "tandem/fabric/fabric.h"
#include "tandem/log.h"
#include "tandemd.h"

namespace {

using tandem::server::BrokerOptions;
using tandem::server::WorkerOptions;
using tandem::server::InjectOptions;

// True when every address the host resolves to is a loopback address.
bool IsLoopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool all = true;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all = all && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      all = false;
    }
  }
  freeaddrinfo(res);
  return all;
}

// The token is the file's content without trailing whitespace; an empty one is refused.
bool ReadToken(const std::string& path, std::string* token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *token = ss.str();
  while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back()))) token->pop_back();
  return !token->empty();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandemd: serves this node's GPUs to Tandem clients"};
  std::string listen, token_file, backend = "auto", devices;
  bool insecure = false;
  int64_t timeout_ms = 10000;
  app.add_option("--listen", listen, "host:port to listen on (port 0 picks a free one)");
  app.add_option("--token-file", token_file, "file holding the token clients must present")->check(CLI::ExistingFile);
  app.add_option("--backend", backend, "opencl, cuda or auto (CUDA when it has a device, else OpenCL)")
      ->check(CLI::IsMember({"opencl", "cuda", "auto"}));
  app.add_flag("--insecure", insecure, "allow a non-loopback address without a token file");
  app.add_option("--devices", devices, "comma-separated indices of the backend's devices to serve");
  app.add_option("--session-timeout-ms", timeout_ms, "end a session after this long without a message")
      ->check(CLI::PositiveNumber);
  int64_t grace_ms = 15000;
  app.add_option("--session-grace-ms", grace_ms,
                 "keep a session whose client's connection broke this long for the client to reconnect and "
                 "resume it (default 15000, beyond the clients' 10 s TANDEM_FAILOVER_TIMEOUT_MS)")
      ->check(CLI::PositiveNumber);
  uint32_t max_sessions = 64;
  app.add_option("--max-sessions", max_sessions, "live sessions at most (more clients are refused, kOverload)")
      ->check(CLI::PositiveNumber);
  // Fault injection (tests and evaluation): passed on to every session worker.
  InjectOptions inject;
  app.add_option("--inject-bitflip", inject.bitflip_rate,
                 "flip one random bit of the data or digest of a read back with this probability per read back")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--inject-bitflip-per-s", inject.bitflip_per_s,
                 "instead, flip bits at this many a second (a Poisson process), each in the next read back")
      ->check(CLI::NonNegativeNumber)
      ->excludes("--inject-bitflip");
  app.add_option("--inject-stall-after", inject.stall_after, "each session stops answering after this many commands");
  app.add_option("--inject-exit-after", inject.exit_after, "each session's worker dies after this many commands");
  app.add_option("--inject-cut-bulk-every", inject.cut_bulk_every,
                 "each session's worker drops its client's connection while every N-th RMA transfer with it is "
                 "under way (the client must resume the session and the transfer be done again)");
  // The worker role: started by the broker itself, never by users.
  WorkerOptions w;
  bool worker = false;
  app.add_flag("--worker", worker)->group("");
  app.add_flag("--probe", w.probe)->group("");
  app.add_flag("--fixed-layout", w.fixed_layout)->group("");
  app.add_option("--bind", w.bind_host)->group("");
  app.add_option("--status-fd", w.status_fd)->group("");
  CLI11_PARSE(app, argc, argv);

  if (worker) {
    w.backend = backend;
    w.devices = devices;
    w.session_timeout = std::chrono::milliseconds(timeout_ms);
    w.session_grace = std::chrono::milliseconds(grace_ms);
    w.inject = inject;
    const char* key = std::getenv(tandem::server::kSessionKeyEnv);
    w.session_key = key ? std::strtoull(key, nullptr, 10) : 0;
    ::unsetenv(tandem::server::kSessionKeyEnv);
    if (w.status_fd < 0 || (!w.probe && w.session_key == 0)) {
      fmt::print(stderr, "tandemd: --worker is started by tandemd itself\n");
      return 2;
    }
    return tandem::server::RunWorker(w);
  }

  if (listen.empty()) {
    fmt::print(stderr, "tandemd: --listen host:port is required\n");
    return 2;
  }
  BrokerOptions b;
  b.listen = listen;
  b.backend = backend;
  b.devices = devices;
  b.session_timeout = std::chrono::milliseconds(timeout_ms);
  b.session_grace = std::chrono::milliseconds(grace_ms);
  b.max_sessions = max_sessions;
  b.inject = inject;
  if (!token_file.empty()) {
    std::string token;
    if (!ReadToken(token_file, &token)) {
      fmt::print(stderr, "tandemd: cannot read a token from {}\n", token_file);
      return 2;
    }
    b.token = token;
  }
  std::string host, port;
  if (!tandem::fabric::SplitHostPort(listen, &host, &port)) {
    fmt::print(stderr, "tandemd: --listen '{}' is not host:port\n", listen);
    return 2;
  }
  if (!b.token && !insecure && !IsLoopback(host)) {
    fmt::print(stderr,
               "tandemd: refusing to listen on non-loopback {} without --token-file; add --insecure to allow "
               "anyone who can reach it to use the GPUs\n",
               host);
    return 2;
  }
  return tandem::server::RunBroker(b);
}
