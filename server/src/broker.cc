// The session broker: the process listening on --listen. It answers only Hello and
// ServerStatus; a good Hello forks and execs a worker process for the session and tells
// the client the worker's port and session key. It never opens a GPU itself.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "tandem/fabric/fabric.h"
#include "tandem/ir/codec.h"
#include "tandem/log.h"
#include "tandemd.h"

extern char** environ;

namespace tandem::server {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

constexpr auto kWorkerStartTimeout = std::chrono::seconds(60);

// Compares every byte whatever the contents, so timing does not reveal how much matched.
bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

Result<uint64_t> RandomKey() {
  uint64_t key = 0;
  while (key == 0) {
    if (getrandom(&key, sizeof(key), 0) != static_cast<ssize_t>(sizeof(key)))
      return Status(Code::kInternal, fmt::format("getrandom failed: {}", std::strerror(errno)));
  }
  return key;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// What a worker reported on its status pipe: "ok <port> <kind> <name>" or "error <why>".
struct WorkerReport {
  uint16_t port = 0;
  std::string kind;
  std::string name;
};

Result<WorkerReport> ParseReport(const std::string& line) {
  if (line.rfind("error ", 0) == 0) return Status(Code::kInternal, "session worker failed: " + line.substr(6));
  WorkerReport r;
  char kind[32] = {};
  unsigned port = 0;
  int consumed = 0;
  if (std::sscanf(line.c_str(), "ok %u %31s %n", &port, kind, &consumed) < 2 || port > 65535)
    return Status(Code::kInternal, "session worker sent a malformed report: " + line);
  r.port = static_cast<uint16_t>(port);
  r.kind = kind;
  r.name = line.substr(static_cast<size_t>(consumed));
  return r;
}

// Reads one line from the worker's status pipe, giving up after the start timeout.
Result<std::string> ReadReportLine(int fd) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + kWorkerStartTimeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status(Code::kTimeout, "the session worker did not report in time");
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status(Code::kInternal, fmt::format("poll failed: {}", std::strerror(errno)));
    if (r == 0) continue;
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status(Code::kInternal, "the session worker exited before reporting its port");
    line.append(buf, static_cast<size_t>(n));
    if (auto nl = line.find('\n'); nl != std::string::npos) return line.substr(0, nl);
  }
}

class Broker {
 public:
  explicit Broker(const BrokerOptions& opt) : opt_(opt) {}
  int Run();

 private:
  struct Spawned {
    pid_t pid = -1;
    WorkerReport report;
  };
  Result<Spawned> SpawnWorker(uint64_t key, bool probe, bool fixed_layout = false);
  void Reap();
  void HandleMessage(fabric::PeerId peer, std::span<const uint8_t> msg);
  // Each returns false when the peer must be refused and closed after the reply.
  bool OnHello(fabric::PeerId peer, const ir::Record& rec, ir::BatchWriter& out);
  bool OnServerStatus(const ir::Record& rec, ir::BatchWriter& out);
  bool TokenOk(const std::string& token) const { return !opt_.token || ConstantTimeEqual(token, *opt_.token); }

  BrokerOptions opt_;
  std::string bind_host_;
  std::string kind_;          // the backend workers open: "opencl" or "cuda"
  std::string backend_name_;  // as the backend names itself
  std::unique_ptr<fabric::Endpoint> ep_;
  std::set<pid_t> live_;
  uint64_t total_ = 0;
  pid_t spawned_ = 0;  // the worker OnHello started for the message being answered
};

// fork + exec of /proc/self/exe in its hidden worker role, with a pipe back for its report.
Result<Broker::Spawned> Broker::SpawnWorker(uint64_t key, bool probe, bool fixed_layout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return Status(Code::kInternal, fmt::format("pipe failed: {}", std::strerror(errno)));
  // Everything the child needs is built before fork: after it, only exec-safe calls.
  std::vector<std::string> args = {"/proc/self/exe", "--worker", "--backend", probe ? opt_.backend : kind_,
                                   "--bind", bind_host_, "--devices", opt_.devices,
                                   "--session-timeout-ms", std::to_string(opt_.session_timeout.count()),
                                   "--session-grace-ms", std::to_string(opt_.session_grace.count()),
                                   "--status-fd", "3"};
  if (probe) args.push_back("--probe");
  if (fixed_layout) args.push_back("--fixed-layout");
  if (opt_.inject.bitflip_rate > 0) args.insert(args.end(), {"--inject-bitflip", fmt::format("{}", opt_.inject.bitflip_rate)});
  if (opt_.inject.bitflip_per_s > 0)
    args.insert(args.end(), {"--inject-bitflip-per-s", fmt::format("{}", opt_.inject.bitflip_per_s)});
  if (opt_.inject.stall_after) args.insert(args.end(), {"--inject-stall-after", std::to_string(opt_.inject.stall_after)});
  if (opt_.inject.exit_after) args.insert(args.end(), {"--inject-exit-after", std::to_string(opt_.inject.exit_after)});
  if (opt_.inject.cut_bulk_every)
    args.insert(args.end(), {"--inject-cut-bulk-every", std::to_string(opt_.inject.cut_bulk_every)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string key_env = fmt::format("{}={}", kSessionKeyEnv, key);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, kSessionKeyEnv, std::strlen(kSessionKeyEnv)) != 0) envp.push_back(*e);
  envp.push_back(key_env.data());
  envp.push_back(nullptr);

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status(Code::kOverload, fmt::format("fork failed: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    // The worker dies with its broker; it keeps only stdio and the status pipe as fd 3.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    if (fds[1] == 3)
      ::fcntl(3, F_SETFD, 0);
    else if (::dup2(fds[1], 3) < 0)
      ::_exit(1);
    ::close_range(4, ~0u, 0);
    // Kept across exec; where a sandbox refuses it, the worker says so (--fixed-layout).
    if (fixed_layout) {
      const int current = ::personality(0xffffffff);
      if (current != -1) ::personality(static_cast<unsigned long>(current) | ADDR_NO_RANDOMIZE);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  auto line = ReadReportLine(fds[0]);
  ::close(fds[0]);
  if (!line.ok()) {
    ::kill(pid, SIGKILL);
    if (probe) ::waitpid(pid, nullptr, 0);
    return line.status();
  }
  auto report = ParseReport(line.value());
  if (!report.ok()) {
    ::kill(pid, SIGKILL);
    if (probe) ::waitpid(pid, nullptr, 0);
    return report.status();
  }
  return Spawned{pid, report.value()};
}

void Broker::Reap() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (live_.erase(pid) == 0) continue;
    if (WIFSIGNALED(status))
      log::Warn("session worker {} killed by signal {}", pid, WTERMSIG(status));
    else
      log::Info("session worker {} exited with {}", pid, WEXITSTATUS(status));
  }
}

bool Broker::OnHello(fabric::PeerId peer, const ir::Record& rec, ir::BatchWriter& out) {
  ir::HelloReq req;
  Status st = ir::DecodeRequest(rec.payload, &req);
  // Magic, version and token are checked before anything else is done for this peer.
  if (st.ok() && req.magic != ir::kMagic) st = Status::Protocol(fmt::format("bad magic 0x{:08x} in Hello", req.magic));
  if (st.ok() && req.version != ir::kProtocolVersion)
    st = Status::Protocol(
        fmt::format("client speaks protocol version {}, this server {}", req.version, ir::kProtocolVersion));
  if (!st.ok()) {
    out.AddReply<ir::HelloRep>(rec.header.opcode, rec.header.seq, st, {}, nullptr);
    return true;
  }
  if (!TokenOk(req.token)) {
    log::Warn("refused a Hello from peer {}: wrong or missing token", peer);
    out.AddReply<ir::HelloRep>(rec.header.opcode, rec.header.seq, Status(Code::kAuth, "wrong or missing token"), {},
                               nullptr);
    return false;
  }
  Reap();
  if (live_.size() >= opt_.max_sessions) {
    log::Warn("refused a session for '{}': {} sessions are live (--max-sessions)", req.client, live_.size());
    out.AddReply<ir::HelloRep>(rec.header.opcode, rec.header.seq,
                               Status(Code::kOverload, fmt::format("the server already runs {} sessions", live_.size())),
                               {}, nullptr);
    return true;
  }
  auto key = RandomKey();
  const bool fixed_layout = (req.features & ir::kFeatureFixedLayout) != 0;
  Result<Spawned> worker = key.ok() ? SpawnWorker(key.value(), false, fixed_layout) : Result<Spawned>(key.status());
  if (!worker.ok()) {
    log::Error("cannot start a session for '{}': {}", req.client, worker.status().ToString());
    out.AddReply<ir::HelloRep>(rec.header.opcode, rec.header.seq, worker.status(), {}, nullptr);
    return true;
  }
  live_.insert(worker->pid);
  spawned_ = worker->pid;
  ++total_;
  log::Info("session {} for '{}': worker {} on port {}", total_, req.client, worker->pid, worker->report.port);
  ir::HelloRep rep;
  rep.version = ir::kProtocolVersion;
  rep.features = ir::kFeatureRma | (kind_ == "cuda" ? ir::kFeatureCuda : ir::kFeatureOpenCL);
  rep.session_port = worker->report.port;
  rep.session_key = key.value();
  rep.server_name = HostName();
  out.AddReply(rec.header.opcode, rec.header.seq, Status::Ok(), {}, &rep);
  return true;
}

bool Broker::OnServerStatus(const ir::Record& rec, ir::BatchWriter& out) {
  ir::ServerStatusReq req;
  Status st = ir::DecodeRequest(rec.payload, &req);
  if (!st.ok()) {
    out.AddReply<ir::ServerStatusRep>(rec.header.opcode, rec.header.seq, st, {}, nullptr);
    return true;
  }
  if (!TokenOk(req.token)) {
    out.AddReply<ir::ServerStatusRep>(rec.header.opcode, rec.header.seq,
                                      Status(Code::kAuth, "wrong or missing token"), {}, nullptr);
    return false;
  }
  Reap();
  ir::ServerStatusRep rep{static_cast<uint32_t>(live_.size()), total_, backend_name_,
                          static_cast<uint32_t>(::getpid())};
  out.AddReply(rec.header.opcode, rec.header.seq, Status::Ok(), {}, &rep);
  return true;
}

void Broker::HandleMessage(fabric::PeerId peer, std::span<const uint8_t> msg) {
  ir::BatchWriter out(ir::BatchKind::kReplies);
  std::vector<ir::Record> records;
  bool keep_peer = true;
  spawned_ = 0;
  Status st = ir::ParseBatch(msg, ir::BatchKind::kRequests, &records);
  if (!st.ok()) out.AddReply<ir::PingRep>(0, 0, st, {}, nullptr);
  bool hello_seen = false;
  for (const ir::Record& rec : records) {
    if (rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kHello) && hello_seen) {
      // One session per message: a batch of Hellos must not fork a worker per record.
      out.AddReply<ir::HelloRep>(rec.header.opcode, rec.header.seq,
                                 Status::Protocol("one Hello per message"), {}, nullptr);
    } else if (rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kHello)) {
      hello_seen = true;
      keep_peer = OnHello(peer, rec, out);
    } else if (rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kServerStatus)) {
      keep_peer = OnServerStatus(rec, out);
    } else {
      out.AddReply<ir::PingRep>(
          rec.header.opcode, rec.header.seq,
          Status::Protocol(fmt::format("the session broker answers only Hello and ServerStatus, not {} (0x{:04x})",
                                       ir::CommandName(rec.header.opcode), rec.header.opcode)),
          {}, nullptr);
    }
    if (!keep_peer) break;
  }
  if (!out.empty()) {
    st = ep_->Send(peer, out.Finish());
    if (!st.ok()) log::Warn("cannot reply to peer {}: {}", peer, st.ToString());
    // Nobody will attach to a session whose Hello went unanswered: its worker would wait for
    // its client until the session timeout, counted as live all along.
    if (!st.ok() && spawned_ > 0) {
      log::Warn("session worker {} is ended: its client never learnt of it", spawned_);
      ::kill(spawned_, SIGKILL);
    }
  }
  if (!keep_peer) ep_->Close(peer);
}

int Broker::Run() {
  log::SetComponent("tandemd");
  std::string port;
  if (!fabric::SplitHostPort(opt_.listen, &bind_host_, &port)) {
    log::Error("--listen '{}' is not host:port", opt_.listen);
    return 2;
  }
  // Workers are exec'd, so the broker's registered memory must survive fork under verbs.
  ::setenv("RDMAV_FORK_SAFE", "1", 0);
  // The probe opens the backend once in a child, so the broker never holds a GPU context.
  auto probe = SpawnWorker(0, true);
  if (!probe.ok()) {
    log::Error("no usable backend ({}): {}", opt_.backend, probe.status().ToString());
    return 1;
  }
  ::waitpid(probe->pid, nullptr, 0);
  kind_ = probe->report.kind;
  backend_name_ = probe->report.name;

  fabric::Options fo;
  fo.listen = opt_.listen;
  auto ep = fabric::Endpoint::Open(fo);
  if (!ep.ok()) {
    log::Error("cannot listen on {}: {}", opt_.listen, ep.status().ToString());
    return 1;
  }
  ep_ = std::move(ep.value());
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  log::Write(log::Level::kInfo,
             fmt::format("tandemd listening on {} ({}), backend {}, {}", ep_->address(), ep_->provider(),
                         backend_name_, opt_.token ? "token required" : "no token required"));
  while (!g_stop.load()) {
    Reap();
    auto ev = ep_->Next(std::chrono::milliseconds(500));
    if (!ev.ok()) {
      if (ev.status().code() == Code::kTimeout) continue;
      log::Error("endpoint failed: {}", ev.status().ToString());
      return 1;
    }
    if (ev->kind == fabric::EventKind::kPeerLost) continue;
    HandleMessage(ev->peer, ev->data);
  }
  log::Info("stopping; {} live session(s) end with the broker", live_.size());
  return 0;
}

}  // namespace

int RunBroker(const BrokerOptions& options) { return Broker(options).Run(); }

}  // namespace tandem::server
