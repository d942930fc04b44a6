// The process-wide client runtime: connects to every server of TANDEM_SERVERS, opens one
// session each, learns their devices, and runs the receiver thread.
#include "tandem/client/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "ft.h"
#include "session.h"
#include "stats.h"
#include "tandem/log.h"
#include "tandem/spin.h"
#include "tandem/thread_name.h"

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

class RuntimeImpl;
std::atomic<RuntimeImpl*> g_runtime{nullptr};  // set once its receiver runs; never destroyed

class RuntimeImpl final : public Runtime, public SessionSource {
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
    for (SessionImpl* s : Sessions()) s->Flush();
  }

  // ---- SessionSource (fault tolerance) ----
  Result<SessionImpl*> Open(const std::string& address) override {
    SessionImpl* s = nullptr;
    TANDEM_RETURN_IF_ERROR(Connect(address, &s));
    return s;
  }
  void Retire(SessionImpl* s) override {
    if (!s->health().ok()) return;
    s->set_lost_hook(nullptr);
    s->Post(ir::GoodbyeReq{});
    s->Flush();
    s->Close(Status(Code::kServerLost, "retired by fault tolerance"));
  }

  void Shutdown() override {
    // Once: the program may call it and atexit calls it again.
    if (shut_down_.exchange(true)) return;
    if (ft_) ft_->SettleStandby(std::chrono::milliseconds(1000));
    // Each goodbye is answered, and the program waits for the answers: a goodbye that is
    // only flushed can die with this process (an exit with unread replies resets the TCP
    // connection, and the reset discards what the worker had not read yet), and a resumable
    // session's worker then waits --session-grace-ms for a client that never comes back.
    // Goodbyes only spare the servers that wait, though: a server that died unnoticed
    // (sends to it retry for seconds) must not hold up the program's exit.
    struct Done {
      std::mutex m;
      std::condition_variable cv;
      size_t posted = 0, answered = 0;
      bool flushed = false;
    };
    auto done = std::make_shared<Done>();
    std::thread([this, done] {
      NameThisThread("tdm-goodbye");
      for (SessionImpl* s : Sessions()) {
        if (!s->health().ok()) continue;
        {
          std::lock_guard<std::mutex> l(done->m);
          ++done->posted;
        }
        // Runs on the receiver thread, or with the session's loss: either way it is over.
        s->Post(ir::GoodbyeReq{}, [done](const Status&, ir::GoodbyeRep&&) {
          std::lock_guard<std::mutex> l(done->m);
          ++done->answered;
          done->cv.notify_all();
        });
        s->Flush();
      }
      std::lock_guard<std::mutex> l(done->m);
      done->flushed = true;
      done->cv.notify_all();
    }).detach();
    {
      std::unique_lock<std::mutex> l(done->m);
      if (!done->cv.wait_for(l, std::chrono::seconds(1), [&] { return done->flushed && done->answered == done->posted; }))
        log::Warn("{} of {} servers did not answer their goodbye within 1 s; exiting anyway",
                  done->posted - done->answered, done->posted);
    }
    if (Stats::Enabled()) {
      std::fflush(stdout);  // the summary follows the program's own output
      Stats::Get().Print(Sessions().size());
    }
  }

  // For the free function of the same name (session.h): a thread waiting for its reply.
  void HelpReceive(const std::atomic<bool>& done, Clock::time_point until);

 private:
  void Init();
  // Connects a new session to `server` (start-up, spares, rollbacks); `out` receives it.
  Status Connect(const std::string& server, SessionImpl** out = nullptr);
  std::vector<SessionImpl*> Sessions() {
    std::lock_guard<std::mutex> l(sessions_mu_);
    std::vector<SessionImpl*> out;
    for (auto& s : sessions_) out.push_back(s.get());
    return out;
  }
  template <class Req>
  Result<typename Req::Reply> Exchange(fabric::PeerId peer, const Req& req, const std::string& server,
                                       uint16_t flags = 0);
  void ReceiveLoop();
  // One event, read by the receiver or by a thread waiting for a reply, under reader_mu_ (so
  // each session's replies are handled in order). A lost peer a waiting thread read goes to
  // the receiver (lost_), which routes it under reader_mu_ too: its handling (fault
  // tolerance) is the receiver's.
  void Route(fabric::Event ev, bool receiver);
  void RouteLost();  // under reader_mu_
  void FlushLoop();
  void WakeFlusher();

  Status status_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::mutex sessions_mu_;  // sessions_ grows while the receiver and flusher run
  std::vector<std::unique_ptr<SessionImpl>> sessions_;
  std::unique_ptr<FaultTolerance> ft_;
  std::vector<std::unique_ptr<GroupSession>> unused_;
  // Replies to a handshake (Hello, Attach) once the receiver runs, by peer.
  struct Mailbox {
    std::mutex m;
    std::condition_variable cv;
    std::deque<fabric::Event> events;
  };
  std::mutex mailboxes_mu_;
  std::map<fabric::PeerId, std::shared_ptr<Mailbox>> mailboxes_;
  std::atomic<bool> receiving_{false};
  // A thread waiting for a reply reads the endpoint itself while the receiver stands aside
  // (HelpReceive): the reply is parsed and delivered where it is awaited, as in a ping-pong.
  // Reply callbacks therefore run on the receiver or on a thread blocked in a call.
  std::mutex reader_mu_;                      // the thread in ep_->Next(), and its routing
  std::atomic<int> helpers_{0};               // threads in HelpReceive
  std::atomic<Clock::rep> helped_at_{0};      // when one last read its own reply (0: none did)
  std::mutex lost_mu_;
  std::deque<fabric::Event> lost_;            // lost peers a helper read, for the receiver
  std::vector<std::unique_ptr<Device>> devices_;  // in TANDEM_SERVERS order
  std::vector<Device*> opencl_, cuda_;            // what each API sees (CUDA_VISIBLE_DEVICES applied)
  std::atomic<uint64_t> next_handle_{1};
  std::atomic<bool> shut_down_{false};
  std::mutex flush_mu_;
  std::condition_variable flush_cv_;
  bool flush_kick_ = false;
  // While the program posts, the flusher looks at the batches every half flush delay, so a
  // post need not wake it: the wake-up put 1.9 us before the send of a synchronize that
  // started a batch (H100, traced), and without it a launch + synchronize took 51.3 against
  // 55.2 us (medians of 6 interleaved runs). Both seq_cst: see WakeFlusher.
  std::atomic<bool> flusher_polling_{false};
  std::atomic<Clock::rep> last_wake_request_{0};
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
    options.spin_us = std::max<int>(options.spin_us, static_cast<int>(KeepaliveSpinUs()));
  // The program's thread after a pause (a sleep, host work) sends through the busy-polling
  // progress thread: the idle read-back's slowest leg was the program's own send.
  options.hand_off_idle_us = 200;
  // A send that nothing takes is a lost server after the same deadline as a silent one.
  options.send_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(FailoverTimeout());
  auto ep = fabric::Endpoint::Open(options);
  if (!ep.ok()) {
    status_ = ep.status();
    log::Error("cannot open the fabric endpoint ({}): {}", fabric::ProviderFromEnv(), status_.message());
    return;
  }
  ep_ = std::move(ep).value();

  const FtConfig ft_config = FtConfig::FromEnv();
  if (ft_config.enabled()) {
    ft_ = std::make_unique<FaultTolerance>(ft_config, this);
    DisableDirectCopies();
  }
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
  if (sessions_.empty() && !(ft_ && !ft_config.spares.empty())) {
    status_ = Status(Code::kLinkLost, "no Tandem server answered (" + failures + ")");
    return;
  }
  // Both live until the process ends: the receiver only reads replies, the flusher sends
  // late batches and pings, so a send stuck on a dead server never stops replies.
  receiving_.store(true);
  g_runtime.store(this, std::memory_order_release);
  std::thread([this] { NameThisThread("tdm-receive"); ReceiveLoop(); }).detach();
  std::thread([this] { NameThisThread("tdm-flush"); FlushLoop(); }).detach();

  // Fault tolerance: consecutive entries form groups of TANDEM_REDUNDANCY replicas, and each
  // group is one virtual server whose devices are its first replica's.
  std::map<SessionImpl*, Session*> presented;  // what a device's `session` is
  if (ft_) {
    const size_t n = static_cast<size_t>(ft_config.redundancy);
    std::vector<ServerSpec> kept;
    for (size_t at = 0; at < specs.size(); at += n) {
      std::vector<SessionImpl*> replicas;
      std::vector<std::string> addresses;
      for (size_t k = at; k < std::min(specs.size(), at + n); ++k) {
        SessionImpl* s = by_address[specs[k].address];
        // A server already gone at start-up is replaced by a spare right away.
        while (!s) {
          const std::string spare = ft_->TakeSpare();
          if (spare.empty()) break;
          SessionImpl* got = nullptr;
          if (Connect(spare, &got).ok()) {
            log::Warn("fault tolerance: {} replaces {}, unreachable at start-up", spare, specs[k].address);
            specs[k].address = spare;
            by_address[spare] = s = got;
          }
        }
        if (!s) continue;
        replicas.push_back(s);
        addresses.push_back(specs[k].address);
      }
      if (replicas.size() < n) {
        status_ = Status::Invalid("TANDEM_REDUNDANCY=" + std::to_string(n) + " needs " + std::to_string(n) +
                                  " reachable servers per virtual device; entries " + std::to_string(at + 1) + ".." +
                                  std::to_string(std::min(specs.size(), at + n)) + " have " +
                                  std::to_string(replicas.size()));
        log::Error("{}", status_.message());
        return;
      }
      presented[replicas.front()] = ft_->AddGroup(replicas, addresses);
      kept.push_back(specs[at]);
    }
    specs = std::move(kept);
    if (specs.empty()) {
      status_ = Status(Code::kLinkLost, "no Tandem server answered (" + failures + "), and no spare did");
      return;
    }
  }
  // Learn every device of every session.
  // Under fault tolerance each group is asked, not its first replica: a replica lost by now is
  // being replaced meanwhile, and the spares' sessions join sessions_ as that goes on (a
  // snapshot is walked, not sessions_ itself).
  std::map<SessionImpl*, std::vector<std::unique_ptr<Device>>> found;
  for (SessionImpl* s : Sessions()) {
    if (ft_ && !presented.count(s)) continue;  // a voting replica or a spare: its group speaks for it
    Session* via = ft_ ? presented[s] : static_cast<Session*>(s);
    for (uint32_t i = 0; i < s->device_count_hint; ++i) {
      auto info = via->Call(ir::DeviceInfoReq{.index = i});
      if (!info.ok()) {
        log::Error("{}: device {}: {}", s->server(), i, info.status().message());
        found[s].push_back(nullptr);
        continue;
      }
      auto d = std::make_unique<Device>();
      d->session = via;
      d->remote_index = i;
      d->info = std::move(info).value();
      found[s].push_back(std::move(d));
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
  // Only now: the standby's session joins sessions_, which the lines above walk unlocked.
  if (ft_) ft_->StartStandby();
  std::atexit([] { Runtime::Get().Shutdown(); });
}

template <class Req>
Result<typename Req::Reply> RuntimeImpl::Exchange(fabric::PeerId peer, const Req& req, const std::string& server,
                                                  uint16_t flags) {
  std::shared_ptr<Mailbox> box;
  if (receiving_.load()) {
    box = std::make_shared<Mailbox>();
    std::lock_guard<std::mutex> l(mailboxes_mu_);
    mailboxes_[peer] = box;
  }
  struct Unregister {
    RuntimeImpl* rt;
    fabric::PeerId peer;
    bool on;
    ~Unregister() {
      if (!on) return;
      std::lock_guard<std::mutex> l(rt->mailboxes_mu_);
      rt->mailboxes_.erase(peer);
    }
  } unregister{this, peer, box != nullptr};
  ir::BatchWriter bw(ir::BatchKind::kRequests);
  bw.AddRequest(req, 1, flags);
  TANDEM_RETURN_IF_ERROR(ep_->Send(peer, bw.Finish()));
  auto deadline = std::chrono::steady_clock::now() + connect_timeout_;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status(Code::kTimeout, fmt::format("{} did not answer {} within {} ms", server, Req::kName,
                                                                  connect_timeout_.count()));
    Result<fabric::Event> ev = Status(Code::kTimeout, "");
    if (box) {
      std::unique_lock<std::mutex> l(box->m);
      if (box->cv.wait_for(l, left, [&] { return !box->events.empty(); })) {
        ev = std::move(box->events.front());
        box->events.pop_front();
      }
    } else {
      ev = ep_->Next(left);
    }
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

Status RuntimeImpl::Connect(const std::string& server, SessionImpl** out) {
  std::string host, port;
  if (!fabric::SplitHostPort(server, &host, &port)) return Status::Invalid("not host:port: " + server);

  auto broker = ep_->Connect(server, connect_timeout_);
  if (!broker.ok()) return broker.status();
  auto hello = Exchange(*broker,
                        ir::HelloReq{.magic = ir::kMagic,
                                     .version = ir::kProtocolVersion,
                                     .features = ir::kFeatureRma | ir::kFeatureOpenCL | ir::kFeatureCuda |
                                                 (ft_ ? ir::kFeatureFixedLayout : 0),
                                     .token = TokenFromEnv(),
                                     .client = ClientName()},
                        server);
  ep_->Close(*broker);
  if (!hello.ok()) return hello.status();

  std::string worker_addr = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                            std::to_string(hello->session_port);
  auto worker = ep_->Connect(worker_addr, connect_timeout_);
  if (!worker.ok()) return worker.status();
  // Resumable: a link that breaks while the worker lives is re-established (SessionImpl).
  auto attach = Exchange(*worker, ir::AttachReq{.session_key = hello->session_key}, server, ir::kRecordResumable);
  if (!attach.ok()) {
    ep_->Close(*worker);
    return attach.status();
  }
  log::Info("connected to {} ({}, {} devices, session port {})", server, attach->backend, attach->device_count,
            hello->session_port);
  auto s = std::make_unique<SessionImpl>(ep_.get(), *worker, server, worker_addr, attach->backend,
                                         [this] { WakeFlusher(); }, hello->session_key);
  s->device_count_hint = attach->device_count;
  // With keepalive the worker's threads look for work across the gap between warm-ups from the
  // start, not only once the first warm-up has come (a Warm of no path only says so).
  if (KeepaliveInterval() != Clock::duration::zero())
    s->Post(ir::WarmReq{.device = 0, .what = 0, .spin_us = KeepaliveSpinUs(), .data = {}},
            [](const Status& st, ir::WarmRep&&) {
              if (!st.ok()) log::Debug("keepalive spin request: {}", st.message());
            });
  if (ft_) s->set_lost_hook([ft = ft_.get()](SessionImpl* lost) { ft->OnSessionLost(lost); });
  if (out) *out = s.get();
  std::lock_guard<std::mutex> l(sessions_mu_);
  sessions_.push_back(std::move(s));
  return Status::Ok();
}

// A post whose batch was empty: the flusher must see the batch within its flush delay. When
// the flusher is polling it will; this post's check of flusher_polling_ follows its batch
// insert, and the flusher clears the flag before its sweep, so a flusher that stopped
// polling after this check still finds the batch in that sweep.
void RuntimeImpl::WakeFlusher() {
  last_wake_request_.store(Clock::now().time_since_epoch().count());
  if (flusher_polling_.load()) return;
  {
    std::lock_guard<std::mutex> l(flush_mu_);
    flush_kick_ = true;
  }
  flush_cv_.notify_one();
}

void RuntimeImpl::FlushLoop() {
  // Polling lasts this long after the last post that needed the flusher.
  constexpr auto kPollFor = std::chrono::milliseconds(2);
  std::unique_lock<std::mutex> l(flush_mu_);
  for (;;) {
    l.unlock();
    auto now = Clock::now();
    const bool poll = now - Clock::time_point(Clock::duration(last_wake_request_.load())) < kPollFor;
    flusher_polling_.store(poll);
    Clock::duration wait = std::chrono::milliseconds(200);
    // Each with the time it is looked at: one Tick may send, and so take a while.
    for (SessionImpl* s : Sessions()) wait = std::min(wait, s->Tick(Clock::now()));
    if (poll) wait = std::min<Clock::duration>(wait, std::max<Clock::duration>(FlushDelay() / 2, std::chrono::microseconds(20)));
    l.lock();
    flush_cv_.wait_for(l, wait, [this] { return flush_kick_; });
    flush_kick_ = false;
  }
}

// The receiver stands aside this long after a thread read its own reply: a program that
// synchronizes in a loop finds the endpoint free for it at its next wait. Meanwhile what
// nobody waits for (a keepalive's answer, an asynchronous callback's reply) waits in the
// endpoint's queue, for this long plus a nap at most, unless a waiting thread reads it first.
constexpr auto kAside = std::chrono::microseconds(500);

void RuntimeImpl::RouteLost() {
  std::deque<fabric::Event> lost;
  {
    std::lock_guard<std::mutex> l(lost_mu_);
    lost.swap(lost_);
  }
  for (fabric::Event& e : lost) Route(std::move(e), true);
}

void RuntimeImpl::ReceiveLoop() {
  for (;;) {
    if (helpers_.load() > 0 ||
        Clock::now().time_since_epoch().count() - helped_at_.load(std::memory_order_relaxed) <
            std::chrono::duration_cast<Clock::duration>(kAside).count()) {
      // Lost peers a helper read are handled here, under the reader lock like every event.
      if (std::unique_lock<std::mutex> reading(reader_mu_, std::try_to_lock); reading.owns_lock()) RouteLost();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      continue;
    }
    std::lock_guard<std::mutex> reading(reader_mu_);
    RouteLost();  // one a helper read while this thread waited for the lock
    auto ev = ep_->Next(std::chrono::milliseconds(200));
    if (!ev.ok()) {
      if (ev.status().code() != Code::kTimeout) log::Debug("receiver: {}", ev.status().ToString());
      continue;
    }
    Route(std::move(ev).value(), true);
  }
}

void RuntimeImpl::HelpReceive(const std::atomic<bool>& done, Clock::time_point until) {
  if (done.load(std::memory_order_acquire)) return;
  helpers_.fetch_add(1);
  bool read = false;  // this thread held the reader lock
  for (SpinPause p; !done.load(std::memory_order_acquire);) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - Clock::now());
    if (left.count() <= 0) break;
    std::unique_lock<std::mutex> reading(reader_mu_, std::try_to_lock);
    if (!reading.owns_lock()) {  // the receiver (until it stands aside) or another waiting thread
      p.Once();
      continue;
    }
    read = true;
    // Reads the completion queue itself until the first event or the end of the window.
    auto ev = ep_->Next(std::min<std::chrono::microseconds>(left, std::chrono::milliseconds(1)));
    if (ev.ok()) {
      Route(std::move(ev).value(), false);
    } else if (ev.status().code() != Code::kTimeout) {
      log::Debug("reading for a reply: {}", ev.status().ToString());
      break;  // the receiver reads (and reports) from here on
    }
  }
  // Only a thread that read its own reply keeps the receiver aside: one that gave up goes to
  // sleep, and its reply must not wait for the receiver's return.
  const bool got = read && done.load(std::memory_order_acquire);
  helped_at_.store(got ? Clock::now().time_since_epoch().count() : 0, std::memory_order_relaxed);
  helpers_.fetch_sub(1);
}

void RuntimeImpl::Route(fabric::Event ev, bool receiver) {
  {
    std::shared_ptr<Mailbox> box;
    {
      std::lock_guard<std::mutex> l(mailboxes_mu_);
      if (auto it = mailboxes_.find(ev.peer); it != mailboxes_.end()) box = it->second;
    }
    if (box) {
      std::lock_guard<std::mutex> l(box->m);
      box->events.push_back(std::move(ev));
      box->cv.notify_all();
      return;
    }
  }
  if (ev.kind == fabric::EventKind::kPeerLost && !receiver) {
    std::lock_guard<std::mutex> l(lost_mu_);
    lost_.push_back(std::move(ev));
    return;
  }
  SessionImpl* target = nullptr;
  {
    std::lock_guard<std::mutex> l(sessions_mu_);
    for (auto& s : sessions_)
      if (s->peer() == ev.peer) target = s.get();
  }
  if (!target) {
    log::Debug("message from an unknown peer {} dropped", ev.peer);
    return;
  }
  if (ev.kind == fabric::EventKind::kPeerLost)
    target->OnLinkLost(ev.peer, Status(Code::kServerLost, ev.status.message()));
  else target->OnMessage(ev.data);
}

}  // namespace

void HelpReceive(const std::atomic<bool>& done, Clock::time_point until) {
  if (RuntimeImpl* rt = g_runtime.load(std::memory_order_acquire)) rt->HelpReceive(done, until);
}

Runtime& Runtime::Get() {
  // Never destroyed: CUDA's unregister hooks run from atexit after static destructors.
  static RuntimeImpl* runtime = new RuntimeImpl();
  return *runtime;
}

}  // namespace tandem::client
