// The process-wide client runtime: connects to every server of TANDEM_SERVERS, opens one
// session each, learns their devices, and runs the receiver thread.
#include "tandem/client/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "session.h"
#include "stats.h"
#include "tandem/log.h"

namespace tandem::client {

const ir::bytes* Device::Prop(uint32_t key) const {
  for (const auto& p : info.props)
    if (p.key == key) return &p.value;
  return nullptr;
}

std::vector<std::string> ParseServerList(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool ParseServerSpec(const std::string& entry, ServerSpec* out) {
  std::string address = entry.substr(0, entry.find('/'));
  std::string host, port;
  if (!fabric::SplitHostPort(address, &host, &port)) return false;
  out->address = address;
  out->device.reset();
  if (address.size() == entry.size()) return true;
  const std::string dev = entry.substr(address.size() + 1);
  if (dev.empty() || dev.size() > 9 || dev.find_first_not_of("0123456789") != std::string::npos) return false;
  out->device = static_cast<uint32_t>(std::stoul(dev));
  return true;
}

std::vector<size_t> VisibleDevices(const char* env, size_t n) {
  std::vector<size_t> out;
  if (!env) {
    for (size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) break;
    size_t i = std::stoul(item);
    if (i >= n || std::find(out.begin(), out.end(), i) != out.end()) break;
    out.push_back(i);
  }
  return out;
}

std::string TokenFromEnv() {
  if (const char* t = std::getenv("TANDEM_TOKEN")) return t;
  if (const char* f = std::getenv("TANDEM_TOKEN_FILE")) {
    std::ifstream in(f);
    std::string token;
    std::getline(in, token);
    if (!in && token.empty()) log::Error("cannot read TANDEM_TOKEN_FILE {}", f);
    return token;
  }
  return "";
}

namespace {

std::chrono::milliseconds EnvMillis(const char* name, long fallback) {
  const char* v = std::getenv(name);
  long ms = v ? std::strtol(v, nullptr, 10) : 0;
  return std::chrono::milliseconds(ms > 0 ? ms : fallback);
}

std::string ClientName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name + "[" + std::to_string(getpid()) + "]";
}

class RuntimeImpl final : public Runtime {
 public:
  RuntimeImpl() { Init(); }

  Status status() const override { return status_; }

  std::vector<Device*> Devices(Api api) override {
    if (api == Api::kOpenCL) return opencl_;
    if (api == Api::kCuda) return cuda_;
    // A mask of APIs (tandem info): every device that speaks one of them, in list order.
    std::vector<Device*> out;
    for (auto& d : devices_)
      if (d->info.api & static_cast<uint32_t>(api)) out.push_back(d.get());
    return out;
  }

  uint64_t NewHandle() override { return next_handle_.fetch_add(1, std::memory_order_relaxed); }

  void FlushAll() override {
    for (auto& s : sessions_) s->Flush();
  }

  void Shutdown() override {
    // Once: the program may call it and atexit calls it again.
    if (shut_down_.exchange(true)) return;
    // Goodbyes only spare the servers their idle timeout: a server that died unnoticed
    // (sends to it retry for seconds) must not hold up the program's exit.
    struct Done {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
    };
    auto done = std::make_shared<Done>();
    std::thread([this, done] {
      for (auto& s : sessions_) {
        if (!s->health().ok()) continue;
        s->Post(ir::GoodbyeReq{});
        s->Flush();
      }
      std::lock_guard<std::mutex> l(done->m);
      done->done = true;
      done->cv.notify_all();
    }).detach();
    {
      std::unique_lock<std::mutex> l(done->m);
      if (!done->cv.wait_for(l, std::chrono::seconds(1), [&] { return done->done; }))
        log::Warn("a server did not take its goodbye within 1 s; exiting anyway");
    }
    if (Stats::Enabled()) {
      std::fflush(stdout);  // the summary follows the program's own output
      Stats::Get().Print(sessions_.size());
    }
  }

 private:
  void Init();
  Status Connect(const std::string& server);
  template <class Req>
  Result<typename Req::Reply> Exchange(fabric::PeerId peer, const Req& req, const std::string& server);
  void ReceiveLoop();
  void FlushLoop();
  void WakeFlusher();

  Status status_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::vector<std::unique_ptr<SessionImpl>> sessions_;
  std::vector<std::unique_ptr<Device>> devices_;  // in TANDEM_SERVERS order
  std::vector<Device*> opencl_, cuda_;            // what each API sees (CUDA_VISIBLE_DEVICES applied)
  std::atomic<uint64_t> next_handle_{1};
  std::atomic<bool> shut_down_{false};
  std::mutex flush_mu_;
  std::condition_variable flush_cv_;
  bool flush_kick_ = false;
  std::chrono::milliseconds connect_timeout_ = EnvMillis("TANDEM_CONNECT_TIMEOUT_MS", 5000);
};

void RuntimeImpl::Init() {
  const char* list = std::getenv("TANDEM_SERVERS");
  std::vector<std::string> servers = ParseServerList(list ? list : "");
  if (servers.empty()) {
    status_ = Status::Invalid("TANDEM_SERVERS is not set: no Tandem servers to use");
    return;
  }
  fabric::Options options;
  // With keepalive, the client's fabric threads look for the next message across the whole
  // gap between two warm-ups, so an idle link answers like a busy one (at the cost of CPU
  // while the program runs; keepalive stops after TANDEM_KEEPALIVE_HOLD_MS of inactivity).
  if (KeepaliveInterval() != Clock::duration::zero())
    options.spin_us = std::max<int>(
        options.spin_us,
        static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(KeepaliveInterval()).count() + 1000));
  auto ep = fabric::Endpoint::Open(options);
  if (!ep.ok()) {
    status_ = ep.status();
    log::Error("cannot open the fabric endpoint ({}): {}", fabric::ProviderFromEnv(), status_.message());
    return;
  }
  ep_ = std::move(ep).value();

  // One session per server, however many entries name it.
  std::vector<ServerSpec> specs;
  std::map<std::string, SessionImpl*> by_address;
  std::string failures;
  for (const auto& entry : servers) {
    ServerSpec spec;
    if (!ParseServerSpec(entry, &spec)) {
      log::Error("TANDEM_SERVERS entry '{}' is not host:port or host:port/device", entry);
      failures += (failures.empty() ? "" : "; ") + entry + ": not host:port[/device]";
      continue;
    }
    specs.push_back(spec);
    if (by_address.count(spec.address)) continue;
    Status st = Connect(spec.address);
    by_address[spec.address] = st.ok() ? sessions_.back().get() : nullptr;
    if (!st.ok()) {
      log::Error("cannot use server {}: {}", spec.address, st.message());
      failures += (failures.empty() ? "" : "; ") + spec.address + ": " + st.message();
    }
  }
  if (sessions_.empty()) {
    status_ = Status(Code::kLinkLost, "no Tandem server answered (" + failures + ")");
    return;
  }
  // Both live until the process ends: the receiver only reads replies, the flusher sends
  // late batches and pings, so a send stuck on a dead server never stops replies.
  std::thread([this] { ReceiveLoop(); }).detach();
  std::thread([this] { FlushLoop(); }).detach();

  // Learn every device of every session.
  std::map<SessionImpl*, std::vector<std::unique_ptr<Device>>> found;
  for (auto& s : sessions_) {
    for (uint32_t i = 0; i < s->device_count_hint; ++i) {
      auto info = s->Call(ir::DeviceInfoReq{.index = i});
      if (!info.ok()) {
        log::Error("{}: device {}: {}", s->server(), i, info.status().message());
        found[s.get()].push_back(nullptr);
        continue;
      }
      auto d = std::make_unique<Device>();
      d->session = s.get();
      d->remote_index = i;
      d->info = std::move(info).value();
      found[s.get()].push_back(std::move(d));
    }
  }
  // The device list follows the entries: "host:port" adds the server's devices not listed
  // yet, "host:port/N" its device N.
  for (const ServerSpec& spec : specs) {
    SessionImpl* s = by_address[spec.address];
    if (!s) continue;
    auto& devs = found[s];
    if (spec.device && *spec.device >= devs.size()) {
      log::Error("{} has {} devices: no device {}", spec.address, devs.size(), *spec.device);
      continue;
    }
    for (size_t i = 0; i < devs.size(); ++i)
      if (devs[i] && (!spec.device || *spec.device == i)) devices_.push_back(std::move(devs[i]));
  }
  // Each API's list; CUDA's filtered and ordered by CUDA_VISIBLE_DEVICES, as CUDA does.
  std::vector<Device*> cuda_all;
  for (auto& d : devices_) {
    if (d->info.api & static_cast<uint32_t>(Api::kOpenCL)) {
      d->index = static_cast<uint32_t>(opencl_.size());
      opencl_.push_back(d.get());
    }
    if (d->info.api & static_cast<uint32_t>(Api::kCuda)) cuda_all.push_back(d.get());
  }
  for (size_t i : VisibleDevices(std::getenv("CUDA_VISIBLE_DEVICES"), cuda_all.size())) {
    cuda_all[i]->index = static_cast<uint32_t>(cuda_.size());
    cuda_.push_back(cuda_all[i]);
  }
  std::atexit([] { Runtime::Get().Shutdown(); });
}

template <class Req>
Result<typename Req::Reply> RuntimeImpl::Exchange(fabric::PeerId peer, const Req& req, const std::string& server) {
  ir::BatchWriter bw(ir::BatchKind::kRequests);
  bw.AddRequest(req, 1);
  TANDEM_RETURN_IF_ERROR(ep_->Send(peer, bw.Finish()));
  auto deadline = std::chrono::steady_clock::now() + connect_timeout_;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status(Code::kTimeout, server + " did not answer " + std::string(Req::kName));
    auto ev = ep_->Next(left);
    if (!ev.ok()) {
      if (ev.status().code() == Code::kTimeout) continue;
      return ev.status();
    }
    if (ev->peer != peer) continue;  // nothing else is in flight during start-up
    if (ev->kind == fabric::EventKind::kPeerLost) return Status(Code::kLinkLost, ev->status.message());
    std::vector<ir::Record> recs;
    TANDEM_RETURN_IF_ERROR(ir::ParseBatch(ev->data, ir::BatchKind::kReplies, &recs));
    if (recs.size() != 1) return Status::Protocol("expected one reply");
    ir::ReplyHead head;
    typename Req::Reply rep{};
    TANDEM_RETURN_IF_ERROR(ir::DecodeReply(recs[0].payload, &head, &rep));
    if (!head.status.ok()) return head.status;
    return rep;
  }
}

Status RuntimeImpl::Connect(const std::string& server) {
  std::string host, port;
  if (!fabric::SplitHostPort(server, &host, &port)) return Status::Invalid("not host:port: " + server);

  auto broker = ep_->Connect(server, connect_timeout_);
  if (!broker.ok()) return broker.status();
  auto hello = Exchange(*broker,
                        ir::HelloReq{.magic = ir::kMagic,
                                     .version = ir::kProtocolVersion,
                                     .features = ir::kFeatureRma | ir::kFeatureOpenCL | ir::kFeatureCuda,
                                     .token = TokenFromEnv(),
                                     .client = ClientName()},
                        server);
  ep_->Close(*broker);
  if (!hello.ok()) return hello.status();

  std::string worker_addr = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                            std::to_string(hello->session_port);
  auto worker = ep_->Connect(worker_addr, connect_timeout_);
  if (!worker.ok()) return worker.status();
  auto attach = Exchange(*worker, ir::AttachReq{.session_key = hello->session_key}, server);
  if (!attach.ok()) {
    ep_->Close(*worker);
    return attach.status();
  }
  log::Info("connected to {} ({}, {} devices, session port {})", server, attach->backend, attach->device_count,
            hello->session_port);
  auto s = std::make_unique<SessionImpl>(ep_.get(), *worker, server, worker_addr, attach->backend,
                                         [this] { WakeFlusher(); });
  s->device_count_hint = attach->device_count;
  sessions_.push_back(std::move(s));
  return Status::Ok();
}

void RuntimeImpl::WakeFlusher() {
  {
    std::lock_guard<std::mutex> l(flush_mu_);
    flush_kick_ = true;
  }
  flush_cv_.notify_one();
}

void RuntimeImpl::FlushLoop() {
  std::unique_lock<std::mutex> l(flush_mu_);
  for (;;) {
    l.unlock();
    auto now = Clock::now();
    Clock::duration wait = std::chrono::milliseconds(200);
    for (auto& s : sessions_) wait = std::min(wait, s->Tick(now));
    l.lock();
    flush_cv_.wait_for(l, wait, [this] { return flush_kick_; });
    flush_kick_ = false;
  }
}

void RuntimeImpl::ReceiveLoop() {
  for (;;) {
    auto ev = ep_->Next(std::chrono::milliseconds(200));
    if (!ev.ok()) {
      if (ev.status().code() != Code::kTimeout) log::Debug("receiver: {}", ev.status().ToString());
      continue;
    }
    SessionImpl* target = nullptr;
    for (auto& s : sessions_)
      if (s->peer() == ev->peer) target = s.get();
    if (!target) {
      log::Debug("message from an unknown peer {} dropped", ev->peer);
      continue;
    }
    if (ev->kind == fabric::EventKind::kPeerLost) target->OnLost(Status(Code::kServerLost, ev->status.message()));
    else target->OnMessage(ev->data);
  }
}

}  // namespace

Runtime& Runtime::Get() {
  // Never destroyed: CUDA's unregister hooks run from atexit after static destructors.
  static RuntimeImpl* runtime = new RuntimeImpl();
  return *runtime;
}

}  // namespace tandem::client
