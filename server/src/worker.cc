// A session worker: one process per client session, so one client's crash, bad kernel or
// leak cannot touch another's. Its exit frees every resource of the session.
//
// Threads: the receive thread (this one) reads the endpoint, runs urgent batches at once
// (Ping, so liveness keeps working while the executor is blocked in a long finish, and
// UserEventSet, so a command blocked on a user event can be released) and queues every
// other batch; the executor runs batches in order and sends one reply batch per batch.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "fabric_bulk.h"
#include "peer_link.h"
#include "tandem/fabric/fabric.h"
#include "tandem/log.h"
#include "tandem/server/session.h"
#include "tandemd.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;

void Report(int fd, const std::string& line) {
  std::string msg = line + "\n";
  for (size_t done = 0; done < msg.size();) {
    ssize_t n = ::write(fd, msg.data() + done, msg.size() - done);
    if (n <= 0) return;  // the broker is gone; the session will time out unattached
    done += static_cast<size_t>(n);
  }
}

// Ends the process without running destructors: the executor may be blocked inside the
// backend (a kernel that never finishes), and the kernel frees everything anyway.
[[noreturn]] void EndNow(const std::string& why) {
  log::Info("session ends: {}", why);
  ::_exit(0);
}

std::string WithPort(const std::string& host, const char* port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// Runs deferred replies (a read back or synchronize that waits on the device) one after
// another, in the order the executor handed them over, and sends each when it is ready.
class Waiter {
 public:
  Waiter(fabric::Endpoint* endpoint) : endpoint_(endpoint) {}
  void Start(fabric::PeerId client) {
    client_ = client;
    // Detached: a wait on a user event that is never set must not hold the process at exit.
    std::thread([this] { Loop(); }).detach();
  }
  void Push(std::vector<LateReply> late) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& l : late) queue_.push_back(std::move(l));
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      LateReply next;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      Status st = endpoint_->Send(client_, next());
      if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
    }
  }

  fabric::Endpoint* endpoint_;
  fabric::PeerId client_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LateReply> queue_;
};

// The executor: a queue of request batches run one at a time, in arrival order.
class Executor {
 public:
  Executor(Session* session, fabric::Endpoint* endpoint, const InjectOptions& inject)
      : session_(session), endpoint_(endpoint), waiter_(endpoint), inject_(inject) {}
  // --inject-stall-after: set once the session stopped answering (the receive thread then
  // drops everything, pings included, as a frozen process would).
  bool stalled() const { return stalled_.load(); }
  ~Executor() { Stop(); }

  void Start(fabric::PeerId client) {
    client_ = client;
    waiter_.Start(client);
    thread_ = std::thread([this] { Loop(); });
  }
  void Push(std::vector<uint8_t> msg) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(msg));
    cv_.notify_one();
  }
  bool goodbye() const { return goodbye_.load(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    for (;;) {
      std::vector<uint8_t> msg;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        msg = std::move(queue_.front());
        queue_.pop_front();
      }
      BatchOutcome out = session_->HandleBatch(msg);
      const uint64_t run = session_->commands_run();
      if (inject_.exit_after && run >= inject_.exit_after) {
        log::Warn("fault injection: the worker dies after {} commands", run);
        ::_exit(3);
      }
      if (inject_.stall_after && run >= inject_.stall_after) {
        log::Warn("fault injection: the session stops answering after {} commands", run);
        stalled_.store(true);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (!out.reply.empty()) {
        Status st = endpoint_->Send(client_, std::move(out.reply));
        if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
      }
      // After the batch's own replies, so replies leave in the order of their commands.
      if (!out.late.empty()) waiter_.Push(std::move(out.late));
      if (out.goodbye) {
        goodbye_.store(true);
        endpoint_->Interrupt();
        return;
      }
    }
  }

  Session* session_;
  fabric::Endpoint* endpoint_;
  fabric::PeerId client_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;
  Waiter waiter_;
  bool stop_ = false;
  std::atomic<bool> goodbye_{false};
  InjectOptions inject_;
  std::atomic<bool> stalled_{false};
};

void Refuse(fabric::Endpoint& ep, fabric::PeerId peer, const std::string& why) {
  ir::BatchWriter out(ir::BatchKind::kReplies);
  out.AddReply<ir::PingRep>(0, 0, Status(Code::kAuth, why), {}, nullptr);
  Status st = ep.Send(peer, out.Finish());
  if (!st.ok()) log::Debug("cannot answer a refused peer: {}", st.ToString());
  ep.Close(peer);
}

}  // namespace

int RunWorker(const WorkerOptions& opt) {
  log::SetComponent("tandemd-worker");
  std::string chosen;
  auto backend = OpenBackend(opt.backend, BackendOptions{opt.devices}, &chosen);
  if (!backend.ok()) {
    Report(opt.status_fd, "error " + backend.status().ToString());
    return 1;
  }
  if (opt.probe) {
    Report(opt.status_fd, fmt::format("ok 0 {} {}", chosen, backend.value()->name()));
    return 0;
  }

  fabric::Options fo;
  fo.listen = WithPort(opt.bind_host, "0");
  auto opened = fabric::Endpoint::Open(fo);
  if (!opened.ok()) {
    Report(opt.status_fd, "error " + opened.status().ToString());
    return 1;
  }
  std::unique_ptr<fabric::Endpoint> ep = std::move(opened.value());
  Report(opt.status_fd, fmt::format("ok {} {} {}", ep->port(), chosen, backend.value()->name()));
  ::close(opt.status_fd);
  log::Info("session worker on {} ({}), waiting for Attach", ep->address(), backend.value()->name());

  Session session(backend.value().get(), opt.session_key, /*defer_replies=*/true);
  FabricPeerLink peers(ep.get(), opt.session_timeout);
  session.set_peers(&peers);
  // A client with keepalive on asks the worker to keep looking for messages between its
  // warm-ups, so an idle link answers as fast as a busy one.
  session.set_spin_hook([ep = ep.get(), current = -1](uint32_t spin_us) mutable {
    const int want = std::max<int>(fabric::Options{}.spin_us, static_cast<int>(spin_us));
    if (want != current) ep->SetSpin(current = want);
  });
  session.set_faults(FaultInjection{.bitflip_rate = opt.inject.bitflip_rate, .seed = 0});
  Executor executor(&session, ep.get(), opt.inject);
  std::unique_ptr<FabricBulk> bulk;
  std::optional<fabric::PeerId> client;
  auto last_heard = Clock::now();
  // An unattached worker waits as long as an idle session would, then gives up.
  for (;;) {
    if (executor.goodbye()) break;
    auto ev = ep->Next(std::chrono::milliseconds(200));
    if (!ev.ok()) {
      if (ev.status().code() != Code::kTimeout) EndNow("endpoint failed: " + ev.status().ToString());
      if (Clock::now() - last_heard > opt.session_timeout)
        EndNow(fmt::format("nothing heard from the client for {} ms", opt.session_timeout.count()));
      continue;
    }
    fabric::Event& e = ev.value();
    if (e.kind == fabric::EventKind::kPeerLost) {
      if (client && e.peer == *client) EndNow("client lost: " + e.status.ToString());
      peers.OnPeerLost(e.peer, e.status);
      continue;
    }
    if (client && e.peer != *client) {
      // Another session's worker pulling or sending a server-to-server copy.
      if (!peers.OnMessage(e.peer, e.data)) Refuse(*ep, e.peer, "this session belongs to another client");
      continue;
    }
    if (!client) {
      // Before Attach the executor is idle: the first batch is authenticated right here.
      bulk = std::make_unique<FabricBulk>(ep.get(), e.peer, opt.session_timeout);
      backend.value()->set_bulk(bulk.get());
      BatchOutcome out = session.HandleBatch(e.data);
      if (!out.reply.empty()) {
        Status st = ep->Send(e.peer, std::move(out.reply));
        if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
      }
      for (LateReply& late : out.late) {  // the waiter is not started yet: finish them here
        Status st = ep->Send(e.peer, late());
        if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
      }
      if (out.refuse_peer) {
        backend.value()->set_bulk(nullptr);
        bulk.reset();
        ep->Close(e.peer);
        continue;
      }
      client = e.peer;
      last_heard = Clock::now();
      if (out.goodbye) break;
      executor.Start(*client);
      continue;
    }
    last_heard = Clock::now();
    if (executor.stalled()) continue;  // frozen: not even a ping is answered
    if (auto urgent = session.RunUrgent(e.data)) {
      if (!urgent->empty()) {
        Status st = ep->Send(*client, std::move(*urgent));
        if (!st.ok()) log::Warn("cannot answer an urgent command: {}", st.ToString());
      }
      continue;
    }
    executor.Push(std::move(e.data));
  }
  // Goodbye: the executor is done. Ending the process frees the session at once; an
  // in-process teardown of a GPU driver's contexts can take seconds the broker would
  // count as a live session.
  executor.Stop();
  EndNow("goodbye");
}

}  // namespace tandem::server
