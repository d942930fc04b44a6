// Raw fabric limits on the chosen provider, on one path: the round trip of 8 B messages
// (p50, p90), streaming bandwidth of 1 MiB messages sent back to back (64 MiB, one small
// acknowledgement at the end) and of 64 MiB RMA reads and writes. Client and server run in
// one process (two endpoints) unless --listen / --connect split them over two. With --idle 1,
// also the round trip after the link has been quiet for 0.1-100 ms: the measuring thread
// busy-waits through each gap and both endpoints' progress threads poll throughout (spin
// 1 s; a --listen server only with its own --spin-us), so what is left is the provider's,
// the kernel's and the machine's.
// With --size N, also the round trip of N-byte messages, interleaved with 8 B ones.
//   tandem_fabric_pingpong [--provider P] [--iters N] [--spin-us N] [--idle 1] [--size N]
//   tandem_fabric_pingpong --listen host:port      (server: echoes, exposes a 64 MiB region)
//   tandem_fabric_pingpong --connect host:port     (client: measures)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tandem/fabric/fabric.h"

namespace fab = tandem::fabric;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBulk = 64u << 20;
constexpr size_t kStreamMessage = 1u << 20;
constexpr fab::Millis kTimeout{10000};

[[noreturn]] void Die(const char* what, const tandem::Status& st) {
  std::fprintf(stderr, "fabric_pingpong: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// Server: answers every message with itself, except "R?" (asks for the region's description)
// and streamed messages ('B' first): those are dropped, and "B!" after them is answered "ok".
void Serve(fab::Endpoint& ep, bool forever) {
  std::vector<uint8_t> bulk(kBulk, 0x5a);
  auto mr = ep.Register(bulk.data(), bulk.size(), fab::kRemoteRead | fab::kRemoteWrite);
  if (!mr.ok()) Die("register", mr.status());
  for (;;) {
    auto ev = ep.Next(fab::Millis(forever ? 3600000 : 30000));
    if (!ev.ok()) return;
    if (ev->kind == fab::EventKind::kPeerLost) {
      ep.Close(ev->peer);
      if (!forever) return;
      continue;
    }
    if (!ev->data.empty() && ev->data[0] == 'B') {
      if (ev->data.size() != 2 || ev->data[1] != '!') continue;
      if (auto st = ep.Send(ev->peer, {'o', 'k'}); !st.ok()) Die("ack", st);
    } else if (ev->data.size() == 2 && ev->data[0] == 'R' && ev->data[1] == '?') {
      fab::RemoteRegion r{(*mr)->remote_addr(), kBulk, (*mr)->key()};
      std::vector<uint8_t> reply(sizeof(r));
      std::memcpy(reply.data(), &r, sizeof(r));
      if (auto st = ep.Send(ev->peer, std::move(reply)); !st.ok()) Die("reply", st);
    } else if (auto st = ep.Send(ev->peer, std::move(ev->data)); !st.ok()) {
      std::fprintf(stderr, "fabric_pingpong: echo to peer %llu: %s\n", static_cast<unsigned long long>(ev->peer),
                   st.ToString().c_str());
    }
  }
}

double PingUs(fab::Endpoint& ep, fab::PeerId peer, size_t bytes = 8) {
  auto t0 = Clock::now();
  if (auto st = ep.Send(peer, std::vector<uint8_t>(bytes, 1)); !st.ok()) Die("send", st);
  auto ev = ep.Next(kTimeout);
  if (!ev.ok()) Die("ping", ev.status());
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `server_ep`: the endpoint at `server` when both are in this process, else null.
void Measure(fab::Endpoint& ep, fab::Endpoint* server_ep, const std::string& server, int iters, bool idle, int spin_us,
             size_t size) {
  auto peer = ep.Connect(server, kTimeout);
  if (!peer.ok()) Die("connect", peer.status());
  std::vector<double> rtt;
  for (int i = 0; i < iters + 100; ++i) {
    const double us = PingUs(ep, *peer);
    if (i >= 100) rtt.push_back(us);
  }
  std::sort(rtt.begin(), rtt.end());
  std::printf("provider %s (libfabric %s)\n", ep.provider().c_str(), fab::LibfabricVersion().c_str());
  std::printf("8 B round trip: p50 %.1f us, p90 %.1f us (%d iterations)\n", rtt[rtt.size() / 2],
              rtt[rtt.size() * 9 / 10], iters);
  if (size > 0) {
    // Messages above the provider's inject size (rxm: 64 B with the 48 B header) take another
    // path: interleaved with 8 B ones, so both see the same moment of the machine.
    std::vector<double> small, large;
    for (int i = 0; i < iters; ++i) {
      small.push_back(PingUs(ep, *peer, 8));
      large.push_back(PingUs(ep, *peer, size));
    }
    std::printf("%zu B round trip: p50 %.1f us (interleaved with 8 B: p50 %.1f us, %d iterations)\n", size,
                Median(large), Median(small), iters);
  }
  if (idle) {
    constexpr int kPollUs = 1000000;
    ep.SetSpin(kPollUs);
    if (server_ep) server_ep->SetSpin(kPollUs);
    struct Gap { double ms; int reps; };
    for (Gap g : {Gap{0.1, 200}, Gap{1, 200}, Gap{2, 200}, Gap{5, 100}, Gap{20, 50}, Gap{100, 20}}) {
      std::vector<double> t;
      for (int r = 0; r < g.reps; ++r) {
        const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(g.ms));
        while (Clock::now() < until) {
        }
        t.push_back(PingUs(ep, *peer));
      }
      std::printf("8 B round trip after %g ms idle: p50 %.1f us (%d)\n", g.ms, Median(t), g.reps);
    }
    ep.SetSpin(spin_us);
    if (server_ep) server_ep->SetSpin(spin_us);
  }

  // Streaming: 64 MiB as 1 MiB messages back to back, timed until the acknowledgement of a
  // last small message (delivery is in order) comes back.
  double best_stream = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::vector<uint8_t>> msgs(kBulk / kStreamMessage, std::vector<uint8_t>(kStreamMessage, 'B'));
    auto t0 = Clock::now();
    for (auto& m : msgs)
      if (auto st = ep.Send(*peer, std::move(m)); !st.ok()) Die("stream", st);
    if (auto st = ep.Send(*peer, {'B', '!'}); !st.ok()) Die("stream", st);
    auto ack = ep.Next(kTimeout);
    if (!ack.ok() || ack->data.size() != 2 || ack->data[0] != 'o') Die("stream ack", ack.status());
    best_stream = std::max(best_stream, kBulk / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  std::printf("messages 1 MiB streamed (64 MiB): best of 5 %.2f GB/s\n", best_stream);

  if (auto st = ep.Send(*peer, {'R', '?'}); !st.ok()) Die("send", st);
  auto desc = ep.Next(kTimeout);
  if (!desc.ok() || desc->data.size() != sizeof(fab::RemoteRegion)) Die("region", desc.status());
  fab::RemoteRegion remote;
  std::memcpy(&remote, desc->data.data(), sizeof(remote));
  std::vector<uint8_t> local(kBulk, 0);
  auto mr = ep.Register(local.data(), local.size(), fab::kLocal);
  if (!mr.ok()) Die("register", mr.status());
  for (bool write : {false, true}) {
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = Clock::now();
      auto st = write ? ep.Write(*peer, **mr, 0, remote, 0, kBulk, kTimeout) : ep.Read(*peer, **mr, 0, remote, 0, kBulk, kTimeout);
      if (!st.ok()) Die(write ? "write" : "read", st);
      double gbs = kBulk / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
      best = std::max(best, gbs);
    }
    std::printf("RMA %s 64 MiB: best of 5 %.2f GB/s\n", write ? "write" : "read", best);
  }
  ep.Close(*peer);
}

}  // namespace

int main(int argc, char** argv) {
  fab::Options opt;
  std::string listen, connect;
  int iters = 10000;
  bool idle = false;
  size_t size = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--provider") opt.provider = argv[i + 1];
    else if (a == "--listen") listen = argv[i + 1];
    else if (a == "--connect") connect = argv[i + 1];
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--spin-us") opt.spin_us = std::atoi(argv[i + 1]);
    else if (a == "--idle") idle = std::atoi(argv[i + 1]) != 0;
    else if (a == "--size") size = std::strtoul(argv[i + 1], nullptr, 10);
  }
  // shm's cross-memory attach needs ptrace rights that containers drop.
  setenv("FI_SHM_DISABLE_CMA", "1", 0);
  if (!connect.empty()) {
    auto ep = fab::Endpoint::Open(opt);
    if (!ep.ok()) Die("open", ep.status());
    Measure(**ep, nullptr, connect, iters, idle, opt.spin_us, size);
    return 0;
  }
  fab::Options server_opt = opt;
  server_opt.listen = listen.empty() ? "127.0.0.1:0" : listen;
  auto server = fab::Endpoint::Open(server_opt);
  if (!server.ok()) Die("listen", server.status());
  if (!listen.empty()) {
    std::printf("listening on %s (%s)\n", (*server)->address().c_str(), (*server)->provider().c_str());
    Serve(**server, true);
    return 0;
  }
  std::thread serving([&] { Serve(**server, false); });
  auto client = fab::Endpoint::Open(opt);
  if (!client.ok()) Die("open", client.status());
  Measure(**client, server->get(), (*server)->address(), iters, idle, opt.spin_us, size);
  serving.join();
  return 0;
}
