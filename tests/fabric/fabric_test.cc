// The fabric over loopback (127.0.0.1), run once per provider: tcp (the native TCP RDM, `net`
// on 1.17), tcp;ofi_rxm (its fallback there) and shm. A provider this machine cannot open is
// skipped with the reason.
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "reassembly.h"
#include "tandem/fabric/fabric.h"
#include "wire.h"

namespace tandem::fabric {
namespace {

constexpr Millis kWait{10000};
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  return v;
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string Text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// A loopback port with nothing listening on it (bound, read back, released).
uint16_t UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Every test runs with TANDEM_FABRIC_PROVIDER set to its parameter, as a user would.
class FabricTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("TANDEM_FABRIC_PROVIDER", GetParam().c_str(), 1);
    auto s = Endpoint::Open(ServerOptions());
    if (!s.ok()) GTEST_SKIP() << "provider " << GetParam() << " unavailable: " << s.status().ToString();
    server_ = std::move(*s);
  }
  void TearDown() override {
    // The clients are gone: let the server take in their goodbyes before it closes too. With
    // shm in one process a closed peer's region is unmapped, and writing to it would crash
    // (a peer in another process keeps its mapping).
    if (server_) {
      while (server_->Next(Millis(200)).ok()) {
      }
    }
    unsetenv("TANDEM_FABRIC_PROVIDER");
  }

  virtual Options ServerOptions() {
    Options o;
    o.listen = "127.0.0.1:0";
    return o;
  }

  std::unique_ptr<Endpoint> OpenClient(Options o = {}) {
    auto c = Endpoint::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The next event, which must be a message.
  static Event NextMessage(Endpoint& ep) {
    auto ev = ep.Next(kWait);
    EXPECT_TRUE(ev.ok()) << ev.status().ToString();
    if (!ev.ok()) return {};
    EXPECT_EQ(ev->kind, EventKind::kMessage) << ev->status.ToString();
    return std::move(*ev);
  }

  // Connects `client` and has it say hello, so the server learns its PeerId.
  std::pair<PeerId, PeerId> Join(Endpoint& client, const std::string& hello) {
    auto peer = client.Connect(server_->address(), kWait);
    EXPECT_TRUE(peer.ok()) << peer.status().ToString();
    if (!peer.ok()) return {0, 0};
    EXPECT_TRUE(client.Send(*peer, Bytes(hello)).ok());
    Event ev = NextMessage(*server_);
    EXPECT_EQ(Text(ev.data), hello);
    return {*peer, ev.peer};
  }

  // reader: another thread reads the CQ in Next() throughout, so the client's small sends are
  // handed over to it (a peer that refuses them must not hold the send buffers every peer needs).
  void DeadPeerHoldsUpNoSendToALiveOne(bool reader) {
    if (GetParam().rfind("tcp", 0) != 0) GTEST_SKIP() << "a peer process killed mid-connection is a tcp case";
    const std::string dead_address = "127.0.0.1:" + std::to_string(UnusedPort());
    const pid_t pid = fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execl(TANDEM_FABRIC_PINGPONG, TANDEM_FABRIC_PINGPONG, "--listen", dead_address.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
    Options o;
    o.send_timeout = Millis(3000);
    if (reader) o.spin_us = 200000;  // Next() reads the CQ through its whole wait
    auto client = OpenClient(o);
    ASSERT_TRUE(client);
    Result<PeerId> dead = Status(Code::kTimeout, "not tried");
    for (int i = 0; i < 100 && !dead.ok(); ++i) {
      dead = client->Connect(dead_address, Millis(2000));
      if (!dead.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(dead.ok()) << dead.status().ToString();
    ASSERT_TRUE(client->Send(*dead, Bytes("echo me")).ok());
    auto echo = client->Next(kWait);
    ASSERT_TRUE(echo.ok() && echo->kind == EventKind::kMessage) << echo.status().ToString();
    auto [to_server, to_client] = Join(*client, "hello");
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);

    std::atomic<bool> lost_seen{false}, stop{false};
    std::thread reading;
    if (reader) {
      reading = std::thread([&, dead_peer = *dead] {
        while (!stop.load()) {
          auto ev = client->Next(Millis(50));
          if (ev.ok() && ev->kind == EventKind::kPeerLost && ev->peer == dead_peer) lost_seen.store(true);
        }
      });
    }
    // Each round: one message to the dead peer (small and inlined; every tenth 3 MiB, fragmented:
    // well under what a dead peer may hold before its senders wait), one to the live one, which
    // must arrive at once.
    const auto start = Clock::now();
    Clock::duration slowest{}, slowest_live{};
    bool lost = false;
    for (int i = 0; !lost && Clock::now() - start < std::chrono::seconds(8); ++i) {
      const auto t0 = Clock::now();
      Status st = client->Send(*dead, i % 10 == 5 ? Pattern(3u << 20, i) : Bytes("are you there?"));
      slowest = std::max(slowest, Clock::now() - t0);
      if (!st.ok()) lost = true;  // refused once the peer is known lost
      const auto t1 = Clock::now();
      Status live = client->Send(to_server, Bytes("round " + std::to_string(i)));
      slowest_live = std::max(slowest_live, Clock::now() - t1);
      if (!live.ok()) ADD_FAILURE() << "round " << i << ": " << live.ToString();
      if (!reader) {
        for (;;) {
          auto ev = client->Next(Millis(0));
          if (!ev.ok()) break;
          if (ev->kind == EventKind::kPeerLost && ev->peer == *dead) lost = true;
        }
      }
      lost = lost || lost_seen.load();
      auto at_server = server_->Next(Millis(1000));
      if (!at_server.ok() || Text(at_server->data) != "round " + std::to_string(i)) {
        ADD_FAILURE() << "round " << i << ": " << (at_server.ok() ? Text(at_server->data) : at_server.status().ToString());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop.store(true);
    if (reading.joinable()) reading.join();
    if (reader) {
      EXPECT_GT(client->sends_handed_off(), 0u);  // the path under test was taken
    }
    EXPECT_TRUE(lost) << "the dead peer was never reported lost";
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3000 + 2000)) << "reported lost late";
    EXPECT_LT(slowest, std::chrono::milliseconds(500)) << "a Send to the dead peer waited for it";
    EXPECT_LT(slowest_live, std::chrono::milliseconds(500)) << "a Send to the live peer waited for the dead one";
    client->Close(*dead);
  }

  std::unique_ptr<Endpoint> server_;
};

TEST_P(FabricTest, ListenerReportsRealPortAndProvider) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  // "tcp" is libfabric's native TCP RDM: `net` on 1.17 (tcp;ofi_rxm only where net is missing).
  // (FI_PROVIDER=tcp hides net from libfabric: then the fallback is what is asked for.)
  if (GetParam() == "tcp" && fi_version() < FI_VERSION(1, 18) && !std::getenv("FI_PROVIDER"))
    EXPECT_EQ(server_->provider(), "net") << server_->provider();
  else
    EXPECT_EQ(server_->provider().rfind(GetParam(), 0), 0u) << server_->provider();
}

TEST_P(FabricTest, ConnectIsAcknowledged) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto peer = client->Connect(server_->address(), kWait);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_NE(*peer, 0u);
}

TEST_P(FabricTest, SmallMessagesPingPongBothWays) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  ASSERT_NE(to_server, 0u);
  for (int i = 0; i < 200; ++i) {
    std::string ping = "ping " + std::to_string(i);
    ASSERT_TRUE(client->Send(to_server, Bytes(ping)).ok());
    Event at_server = NextMessage(*server_);
    ASSERT_EQ(Text(at_server.data), ping);
    ASSERT_EQ(at_server.peer, to_client);
    ASSERT_TRUE(server_->Send(to_client, Bytes("pong " + std::to_string(i))).ok());
    ASSERT_EQ(Text(NextMessage(*client).data), "pong " + std::to_string(i));
  }
  // Empty messages are messages too.
  ASSERT_TRUE(client->Send(to_server, {}).ok());
  EXPECT_TRUE(NextMessage(*server_).data.empty());
}

TEST_P(FabricTest, TenMiBMessageIsFragmentedAndReassembled) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  auto big = Pattern(10u << 20, 7);
  ASSERT_TRUE(client->Send(to_server, big).ok());
  Event ev = NextMessage(*server_);
  ASSERT_EQ(ev.data.size(), big.size());
  EXPECT_TRUE(ev.data == big);
  // And back, one byte longer than a whole number of fragments.
  big.push_back(42);
  ASSERT_TRUE(server_->Send(to_client, big).ok());
  EXPECT_TRUE(NextMessage(*client).data == big);
}

// Message i: Pattern(size, i) with i in its first bytes.
std::vector<uint8_t> Numbered(int i, size_t size) {
  auto msg = Pattern(size, i);
  std::memcpy(msg.data(), &i, sizeof(i));
  return msg;
}

// Sends `count` numbered messages of size(i) from a thread of their own (pause(i) before
// each) and checks that the server gets each whole, in order.
template <class Size, class Pause>
void SendAndCheckInOrder(Endpoint& client, PeerId to, Endpoint& server, int count, Size size, Pause pause) {
  std::thread sender([&] {
    for (int i = 0; i < count; ++i) {
      pause(i);
      ASSERT_TRUE(client.Send(to, Numbered(i, size(i))).ok());
    }
  });
  for (int i = 0; i < count; ++i) {
    auto ev = server.Next(kWait);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    ASSERT_EQ(ev->kind, EventKind::kMessage) << ev->status.ToString();
    ASSERT_GE(ev->data.size(), sizeof(int));
    int seq;
    std::memcpy(&seq, ev->data.data(), sizeof(seq));
    ASSERT_EQ(seq, i);
    ASSERT_TRUE(ev->data == Numbered(i, ev->data.size())) << "message " << i;
  }
  sender.join();
}

TEST_P(FabricTest, ManyMessagesArriveInOrder) {
  // Small fragments, so big and small messages interleave on the wire.
  Options small;
  small.max_message = 4096;
  auto client = OpenClient(small);
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  SendAndCheckInOrder(
      *client, to_server, *server_, 2000, [](int i) { return (i % 7 == 0) ? 20000 + i : 8 + i % 100; }, [](int) {});
}

// One-frame messages from a sender that was idle go out from the busy-polling progress
// thread, fragmented ones from the sender itself: the receiver must still get them in order.
// Then a handed-over message to a peer closed right away is dropped without harm.
TEST_P(FabricTest, HandedOffSendsKeepTheirOrder) {
  Options o;
  o.max_message = 4096;
  o.hand_off_idle_us = 1;  // nearly every send counts as one after a pause
  o.spin_us = 200000;      // and the progress thread polls through the test
  auto client = OpenClient(o);
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  constexpr int kCount = 600;
  SendAndCheckInOrder(
      *client, to_server, *server_, kCount,
      [](int i) { return (i % 5 == 0) ? 9000 + i : 8 + i % 40; },  // 9000+: fragments, sent directly
      [](int i) {
        if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      });
  EXPECT_GT(client->sends_handed_off(), 0u);  // the path under test was taken
  EXPECT_LT(client->sends_handed_off(), static_cast<uint64_t>(kCount));
  std::this_thread::sleep_for(std::chrono::microseconds(10));
  ASSERT_TRUE(client->Send(to_server, Bytes("late")).ok());
  client->Close(to_server);
  client.reset();
}

TEST_P(FabricTest, TwoClientsAreTwoPeers) {
  auto a = OpenClient();
  auto b = OpenClient();
  ASSERT_TRUE(a && b);
  auto [a_to_server, server_to_a] = Join(*a, "I am a");
  auto [b_to_server, server_to_b] = Join(*b, "I am b");
  ASSERT_NE(server_to_a, server_to_b);
  ASSERT_TRUE(server_->Send(server_to_b, Bytes("for b")).ok());
  ASSERT_TRUE(server_->Send(server_to_a, Bytes("for a")).ok());
  EXPECT_EQ(Text(NextMessage(*a).data), "for a");
  EXPECT_EQ(Text(NextMessage(*b).data), "for b");
  // Interleaved traffic keeps its senders apart.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(a->Send(a_to_server, Bytes("a")).ok());
    ASSERT_TRUE(b->Send(b_to_server, Bytes("b")).ok());
  }
  for (int i = 0; i < 40; ++i) {
    Event ev = NextMessage(*server_);
    EXPECT_EQ(ev.peer, Text(ev.data) == "a" ? server_to_a : server_to_b);
  }
}

TEST_P(FabricTest, ConnectToNothingFailsInTime) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  std::string target = "127.0.0.1:" + std::to_string(UnusedPort());
  auto t0 = Clock::now();
  auto peer = client->Connect(target, Millis(2000));
  auto took = Clock::now() - t0;
  ASSERT_FALSE(peer.ok());
  EXPECT_TRUE(peer.status().code() == Code::kLinkLost || peer.status().code() == Code::kTimeout)
      << peer.status().ToString();
  EXPECT_NE(peer.status().message().find(target), std::string::npos) << peer.status().message();
  EXPECT_LT(took, std::chrono::milliseconds(4000));
}

TEST_P(FabricTest, BadAddressIsInvalid) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  EXPECT_EQ(client->Connect("no-port-here", kWait).status().code(), Code::kInvalidArgument);
}

TEST_P(FabricTest, RmaReadAndWrite64MiBAtOffsets) {
  constexpr size_t kLen = 64u << 20;
  constexpr size_t kLocalOff = 4096 + 3, kRemoteOff = 8192 + 5;
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");

  // The server exposes a region and tells the client where it is, as the IR will.
  std::vector<uint8_t> remote_mem(kLen + kRemoteOff + 100, 0);
  auto remote_mr = server_->Register(remote_mem.data(), remote_mem.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(remote_mr.ok()) << remote_mr.status().ToString();
  RemoteRegion remote{(*remote_mr)->remote_addr(), remote_mem.size(), (*remote_mr)->key()};
  std::vector<uint8_t> local_mem(kLen + kLocalOff + 100, 0);
  auto local_mr = client->Register(local_mem.data(), local_mem.size(), kLocal);
  ASSERT_TRUE(local_mr.ok()) << local_mr.status().ToString();

  // Write: client memory lands in the server's region; a message after Wait() proves it is there.
  auto data = Pattern(kLen, 1);
  std::memcpy(local_mem.data() + kLocalOff, data.data(), kLen);
  ASSERT_TRUE(client->Write(to_server, **local_mr, kLocalOff, remote, kRemoteOff, kLen, kWait).ok());
  ASSERT_TRUE(client->Send(to_server, Bytes("written")).ok());
  ASSERT_EQ(Text(NextMessage(*server_).data), "written");
  EXPECT_EQ(std::memcmp(remote_mem.data() + kRemoteOff, data.data(), kLen), 0);
  EXPECT_EQ(remote_mem[kRemoteOff - 1], 0);
  EXPECT_EQ(remote_mem[kRemoteOff + kLen], 0);

  // Read: new server content comes back into the client's buffer.
  auto other = Pattern(kLen, 2);
  std::memcpy(remote_mem.data() + kRemoteOff, other.data(), kLen);
  ASSERT_TRUE(server_->Send(to_client, Bytes("changed")).ok());
  ASSERT_EQ(Text(NextMessage(*client).data), "changed");
  auto op = client->PostRead(to_server, **local_mr, kLocalOff, remote, kRemoteOff, kLen);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  ASSERT_TRUE(client->Wait(*op, kWait).ok());
  EXPECT_EQ(std::memcmp(local_mem.data() + kLocalOff, other.data(), kLen), 0);

  // Out of bounds is refused before anything is posted.
  EXPECT_EQ(client->Read(to_server, **local_mr, 0, remote, remote_mem.size() - 10, 11, kWait).code(),
            Code::kInvalidArgument);
}

// A server registers and drops regions all the time (every large transfer of every client)
// while peers' RMA into its other regions is checked against the same key map inside its CQ
// reads. libfabric 1.17's net provider changes that map on close under no lock of its own:
// ft.linkcut crashed on it in CI (SIGSEGV in ofi_mr_map_verify, 2026-11-27). Without the
// exclusion this failed 5 runs of 5 on tcp (net). The server also connects out meanwhile:
// net may run progress inside a post to a peer not yet connected, but leaving only the posts
// ungated was not caught here in 5 runs (a narrow window).
TEST_P(FabricTest, RegionsComeAndGoWhileAPeersRmaIsChecked) {
  constexpr size_t kLen = 256u << 10;
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  std::vector<uint8_t> target(kLen, 0);
  auto target_mr = server_->Register(target.data(), target.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(target_mr.ok()) << target_mr.status().ToString();
  const RemoteRegion remote{(*target_mr)->remote_addr(), target.size(), (*target_mr)->key()};
  std::vector<uint8_t> local(kLen);
  auto local_mr = client->Register(local.data(), local.size(), kLocal);
  ASSERT_TRUE(local_mr.ok()) << local_mr.status().ToString();

  std::atomic<bool> stop{false};
  std::atomic<int> transfers{0}, connects{0};
  std::thread rma([&] {
    for (uint32_t i = 0; !stop.load(); ++i) {
      const size_t off = (i * 4096u) % (kLen - 4096), len = 4096;
      Status st = (i & 1) ? client->Read(to_server, **local_mr, off, remote, off, len, kWait)
                          : client->Write(to_server, **local_mr, off, remote, off, len, kWait);
      if (!st.ok()) {
        ADD_FAILURE() << "transfer " << i << ": " << st.ToString();
        return;
      }
      transfers.fetch_add(1);
    }
  });
  // The server connects out now and then, as a server does to its peers for direct copies.
  // Not on shm: there a listener opened in this process right after another closed sometimes
  // never answers (10 s; seen without any region changing, 2026-11-27), and net is the case.
  const bool connect_out = GetParam() != "shm";
  std::thread out([&] {
    while (connect_out && !stop.load()) {
      auto listener = Endpoint::Open(ServerOptions());
      if (!listener.ok()) {
        ADD_FAILURE() << listener.status().ToString();
        return;
      }
      auto peer = server_->Connect((*listener)->address(), kWait);
      if (!peer.ok()) {
        ADD_FAILURE() << "connect: " << peer.status().ToString();
        return;
      }
      server_->Close(*peer);
      connects.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the churn needs the cores
    }
  });
  // Meanwhile this thread keeps a few dozen regions and churns them, and reads the server's
  // CQ itself now and then in Next() (with the progress thread reading it otherwise).
  std::vector<std::vector<uint8_t>> memory(48, std::vector<uint8_t>(8192));
  std::vector<std::unique_ptr<MemoryRegion>> held(memory.size());
  int churned = 0;
  const auto until = Clock::now() + std::chrono::milliseconds(2500);
  for (size_t i = 0; Clock::now() < until; ++i) {
    const size_t slot = (i * 7) % held.size();
    held[slot].reset();
    auto mr = server_->Register(memory[slot].data(), memory[slot].size(), kRemoteRead | kRemoteWrite);
    if (!mr.ok()) {
      ADD_FAILURE() << "register: " << mr.status().ToString();
      break;
    }
    held[slot] = std::move(*mr);
    ++churned;
    if (i % 512 == 0) {
      auto ev = server_->Next(std::chrono::microseconds(300));
      if (ev.ok() && ev->kind == EventKind::kPeerLost && ev->peer == to_client) {
        ADD_FAILURE() << "client lost: " << ev->status.ToString();
      }
    }
  }
  stop.store(true);
  rma.join();
  out.join();
  std::printf("%d transfers, %d regions churned, %d connects out\n", transfers.load(), churned, connects.load());
  EXPECT_GT(transfers.load(), 500);
  if (connect_out) {
    EXPECT_GT(connects.load(), 2);
  }
  EXPECT_GT(churned, 2000);
  // The data still lands where it should.
  auto data = Pattern(4096, 9);
  std::memcpy(local.data(), data.data(), data.size());
  ASSERT_TRUE(client->Write(to_server, **local_mr, 0, remote, 0, data.size(), kWait).ok());
  EXPECT_EQ(std::memcmp(target.data(), data.data(), data.size()), 0);
}

TEST_P(FabricTest, ListenerOutlivesAClientThatGoesAway) {
  auto gone = OpenClient();
  auto stays = OpenClient();
  ASSERT_TRUE(gone && stays);
  auto [gone_to_server, server_to_gone] = Join(*gone, "short-lived");
  gone.reset();
  // The departing endpoint says goodbye: the listener sees the peer lost, and forgets it.
  auto ev = server_->Next(kWait);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  EXPECT_EQ(ev->kind, EventKind::kPeerLost);
  EXPECT_EQ(ev->peer, server_to_gone);
  EXPECT_FALSE(server_->Send(server_to_gone, Bytes("anyone?")).ok());
  server_->Close(server_to_gone);

  auto [stays_to_server, server_to_stays] = Join(*stays, "long-lived");
  ASSERT_TRUE(server_->Send(server_to_stays, Bytes("still here")).ok());
  EXPECT_EQ(Text(NextMessage(*stays).data), "still here");
}

TEST_P(FabricTest, ClosedPeerIsForgotten) {
  auto client = OpenClient();
  ASSERT_TRUE(client);
  auto [to_server, to_client] = Join(*client, "hello");
  client->Close(to_server);
  EXPECT_EQ(client->Send(to_server, Bytes("late")).code(), Code::kUnknownHandle);
  auto ev = server_->Next(kWait);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->kind, EventKind::kPeerLost);
  // The server closes while the client still exists: with shm in one process, a goodbye
  // written into a closed endpoint's unmapped region crashes inside libfabric (seen once on
  // the GPU machine under load); the client has no peer left to say goodbye to.
  server_.reset();
}

// A peer killed with SIGKILL (no goodbye) takes nothing more: tcp;ofi_rxm answers every send to
// it -FI_EAGAIN while it tries to reconnect. A Send to it must return at once, traffic to a live
// peer must go on meanwhile, and the dead one is reported lost after send_timeout. (A Send that
// retried until the deadline kept the client's one flushing thread from every other server.)
TEST_P(FabricTest, ADeadPeerHoldsUpNoSendToALiveOne) {
  DeadPeerHoldsUpNoSendToALiveOne(/*reader=*/false);
}

TEST_P(FabricTest, ADeadPeerHoldsUpNoSendToALiveOneWhileAThreadReads) {
  DeadPeerHoldsUpNoSendToALiveOne(/*reader=*/true);
}

TEST_P(FabricTest, InterruptWakesNext) {
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server_->Interrupt();
  });
  auto t0 = Clock::now();
  auto ev = server_->Next(kWait);
  waker.join();
  EXPECT_EQ(ev.status().code(), Code::kTimeout);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Providers, FabricTest, ::testing::Values("tcp", "tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ';', '_');
                           return name;
                         });

// Two TCP stacks cannot talk (net and tcp;ofi_rxm on 1.17): a client on one finds no answer from
// a server on the other, and its error names its stack and that cause, not only "nothing
// listening" (a server started with FI_PROVIDER=tcp falls back to rxm while clients get net).
TEST(FabricStacks, AServerOnAnotherTcpStackTimesOutNamingTheStacks) {
  Options so;
  so.provider = "tcp;ofi_rxm";
  so.listen = "127.0.0.1:0";
  auto server = Endpoint::Open(so);
  Options co;
  co.provider = "net";
  auto client = Endpoint::Open(co);
  if (!server.ok() || !client.ok()) GTEST_SKIP() << "needs both tcp;ofi_rxm and net";
  auto peer = (*client)->Connect((*server)->address(), Millis(1500));
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), Code::kTimeout) << peer.status().ToString();
  EXPECT_NE(peer.status().message().find("another provider stack than this net cannot answer"), std::string::npos)
      << peer.status().ToString();
}

TEST(FabricAddress, SplitHostPort) {
  std::string h, p;
  EXPECT_TRUE(SplitHostPort("127.0.0.1:4242", &h, &p));
  EXPECT_EQ(h, "127.0.0.1");
  EXPECT_EQ(p, "4242");
  EXPECT_TRUE(SplitHostPort("[::1]:0", &h, &p));
  EXPECT_EQ(h, "::1");
  EXPECT_EQ(p, "0");
  EXPECT_FALSE(SplitHostPort("host", &h, &p));
  EXPECT_FALSE(SplitHostPort(":80", &h, &p));
  EXPECT_FALSE(SplitHostPort("host:", &h, &p));
  EXPECT_FALSE(SplitHostPort("host:99999", &h, &p));
  EXPECT_FALSE(SplitHostPort("a:b:1", &h, &p));
  EXPECT_FALSE(SplitHostPort("[::1]80", &h, &p));
}

TEST(FabricAddress, ProviderFromEnvironment) {
  unsetenv("TANDEM_FABRIC_PROVIDER");
  unsetenv("FI_PROVIDER");
  EXPECT_EQ(ProviderFromEnv(), "tcp");
  setenv("FI_PROVIDER", "net", 1);
  EXPECT_EQ(ProviderFromEnv(), "net");
  setenv("TANDEM_FABRIC_PROVIDER", "shm", 1);
  EXPECT_EQ(ProviderFromEnv(), "shm");
  unsetenv("TANDEM_FABRIC_PROVIDER");
  unsetenv("FI_PROVIDER");
}

// A data fragment's header as wire::DecodeHeader would pass it.
wire::Header Fragment(uint64_t msg, uint32_t index, uint32_t count, uint64_t total, uint64_t offset) {
  wire::Header h;
  h.msg_id = msg;
  h.frag_index = index;
  h.frag_count = count;
  h.total_len = total;
  h.offset = offset;
  return h;
}

TEST(FabricReassembly, AHugeClaimHoldsOnlyTheBytesThatCame) {
  // Anyone who reaches the port may send such frames: 56 bytes each, claiming 16 GiB.
  // In use: from the heap and mmapped (large blocks), whether touched or not.
  auto in_use = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const size_t heap_before = in_use();
  Reassembly r;
  std::vector<std::vector<uint8_t>> out;
  const uint8_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (uint64_t msg = 1; msg <= 1000; ++msg)
    ASSERT_TRUE(r.Add(Fragment(msg, 0, 2, wire::kMaxMessage, 0), eight, sizeof eight, &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(r.open(), 1000u);
  EXPECT_EQ(r.held(), 8000u);
  // The same with the fragment placed at the far end of its message.
  for (uint64_t msg = 1001; msg <= 1010; ++msg)
    ASSERT_TRUE(r.Add(Fragment(msg, 1, 2, wire::kMaxMessage, wire::kMaxMessage - 8), eight, 8, &out).ok());
  EXPECT_EQ(r.held(), 8080u);
  // Bookkeeping for 1010 messages, not their claimed sizes.
  EXPECT_LT(in_use() - heap_before, size_t{1} << 20);
}

TEST(FabricReassembly, FragmentsAndMessagesOutOfOrderComeOutInOrder) {
  Reassembly r;
  std::vector<std::vector<uint8_t>> out;
  const auto body = Pattern(10, 7);
  // Message 1 in three fragments, last first; then message 0 whole.
  ASSERT_TRUE(r.Add(Fragment(1, 2, 3, 10, 8), body.data() + 8, 2, &out).ok());
  ASSERT_TRUE(r.Add(Fragment(1, 0, 3, 10, 0), body.data(), 4, &out).ok());
  ASSERT_TRUE(r.Add(Fragment(1, 1, 3, 10, 4), body.data() + 4, 4, &out).ok());
  EXPECT_TRUE(out.empty());  // complete, but message 0 has not come
  const uint8_t zero[3] = {9, 9, 9};
  ASSERT_TRUE(r.Add(Fragment(0, 0, 1, 3, 0), zero, 3, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], std::vector<uint8_t>(zero, zero + 3));
  EXPECT_EQ(out[1], body);
  EXPECT_EQ(r.open(), 0u);
  EXPECT_EQ(r.held(), 0u);
  EXPECT_EQ(r.next(), 2u);
  // A late copy of a message handed on is dropped.
  out.clear();
  EXPECT_TRUE(r.Add(Fragment(0, 0, 1, 3, 0), zero, 3, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(FabricReassembly, FragmentsThatDisagreeOverlapOrFallShortAreProtocolErrors) {
  std::vector<std::vector<uint8_t>> out;
  const auto body = Pattern(16, 3);
  {
    Reassembly r;  // the same fragment twice
    ASSERT_TRUE(r.Add(Fragment(0, 0, 2, 16, 0), body.data(), 8, &out).ok());
    EXPECT_EQ(r.Add(Fragment(0, 0, 2, 16, 0), body.data(), 8, &out).code(), Code::kProtocol);
  }
  {
    Reassembly r;  // a later fragment repeated
    ASSERT_TRUE(r.Add(Fragment(0, 1, 2, 16, 8), body.data() + 8, 8, &out).ok());
    EXPECT_EQ(r.Add(Fragment(0, 1, 2, 16, 8), body.data() + 8, 8, &out).code(), Code::kProtocol);
  }
  {
    Reassembly r;  // a count or total that disagrees with the first fragment's
    ASSERT_TRUE(r.Add(Fragment(0, 0, 2, 16, 0), body.data(), 8, &out).ok());
    EXPECT_EQ(r.Add(Fragment(0, 1, 3, 16, 8), body.data() + 8, 8, &out).code(), Code::kProtocol);
    EXPECT_EQ(r.Add(Fragment(0, 1, 2, 17, 8), body.data() + 8, 8, &out).code(), Code::kProtocol);
  }
  {
    Reassembly r;  // every fragment came, and they leave a hole (two overlap past the first)
    ASSERT_TRUE(r.Add(Fragment(0, 1, 3, 16, 4), body.data() + 4, 8, &out).ok());
    ASSERT_TRUE(r.Add(Fragment(0, 2, 3, 16, 8), body.data() + 8, 4, &out).ok());
    EXPECT_EQ(r.Add(Fragment(0, 0, 3, 16, 0), body.data(), 4, &out).code(), Code::kProtocol);
  }
  EXPECT_TRUE(out.empty());
}

TEST(FabricReassembly, TooManyOpenOrTooFarAheadIsAProtocolError) {
  std::vector<std::vector<uint8_t>> out;
  const uint8_t one[1] = {1};
  Reassembly r(Reassembly::Limits{.max_open = 4, .max_ahead = 100});
  for (uint64_t msg = 1; msg <= 4; ++msg) ASSERT_TRUE(r.Add(Fragment(msg, 0, 2, 2, 0), one, 1, &out).ok());
  EXPECT_EQ(r.Add(Fragment(5, 0, 2, 2, 0), one, 1, &out).code(), Code::kProtocol);
  EXPECT_EQ(r.open(), 4u);
  // A fragment of a message already open is still taken.
  EXPECT_TRUE(r.Add(Fragment(4, 1, 2, 2, 1), one, 1, &out).ok());
  Reassembly far(Reassembly::Limits{.max_open = 4, .max_ahead = 100});
  EXPECT_TRUE(far.Add(Fragment(99, 0, 1, 1, 0), one, 1, &out).ok());
  EXPECT_EQ(far.Add(Fragment(100, 0, 1, 1, 0), one, 1, &out).code(), Code::kProtocol);
  EXPECT_TRUE(out.empty());
}

TEST(FabricReassembly, WholeMessagesBehindALargeOneDoNotCountAsOpen) {
  // Other threads' small frames pile up behind a message still arriving: a legitimate sender.
  std::vector<std::vector<uint8_t>> out;
  const uint8_t one[1] = {1};
  Reassembly r(Reassembly::Limits{.max_open = 4, .max_ahead = 1000, .max_held = 1000});
  ASSERT_TRUE(r.Add(Fragment(0, 0, 2, 2, 0), one, 1, &out).ok());
  for (uint64_t msg = 1; msg <= 100; ++msg) ASSERT_TRUE(r.Add(Fragment(msg, 0, 1, 1, 0), one, 1, &out).ok()) << msg;
  EXPECT_EQ(r.open(), 1u);
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(r.Add(Fragment(0, 1, 2, 2, 1), one, 1, &out).ok());
  EXPECT_EQ(out.size(), 101u);
  EXPECT_EQ(r.held(), 0u);
}

TEST(FabricReassembly, HeldBytesAndShortSingleFragmentsAreBounded) {
  std::vector<std::vector<uint8_t>> out;
  const auto ten = Pattern(10, 1);
  Reassembly r(Reassembly::Limits{.max_open = 4, .max_ahead = 100, .max_held = 16});
  ASSERT_TRUE(r.Add(Fragment(1, 0, 1, 10, 0), ten.data(), 10, &out).ok());  // waits for message 0
  EXPECT_EQ(r.Add(Fragment(2, 0, 1, 10, 0), ten.data(), 10, &out).code(), Code::kProtocol);
  // One fragment that claims more than it carries: a truncated message, refused on either path.
  Reassembly s;
  EXPECT_EQ(s.Add(Fragment(0, 0, 1, 10, 0), ten.data(), 4, &out).code(), Code::kProtocol);
  EXPECT_EQ(s.Add(Fragment(5, 0, 1, 10, 0), ten.data(), 4, &out).code(), Code::kProtocol);
  EXPECT_TRUE(out.empty());
}

TEST(FabricWire, HeaderRoundTripAndSize) {
  wire::Header h;
  h.type = wire::Type::kData;
  h.conn_id = 0x1122334455667788u;
  h.msg_id = 99;
  h.frag_index = 2;
  h.frag_count = 3;
  h.total_len = 3000;
  h.offset = 2000;
  uint8_t buf[wire::kHeaderSize + 1001] = {};
  wire::EncodeHeader(h, buf);
  EXPECT_EQ(buf[0], 'T');  // little-endian magic "TFAB"
  auto d = wire::DecodeHeader(buf, wire::kHeaderSize + 1000);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->conn_id, h.conn_id);
  EXPECT_EQ(d->msg_id, 99u);
  EXPECT_EQ(d->frag_index, 2u);
  EXPECT_EQ(d->offset, 2000u);
  // A fragment running past its message, a short buffer, a wrong magic: all refused.
  EXPECT_FALSE(wire::DecodeHeader(buf, wire::kHeaderSize + 1001));
  EXPECT_FALSE(wire::DecodeHeader(buf, wire::kHeaderSize - 1));
  buf[0] ^= 1;
  EXPECT_FALSE(wire::DecodeHeader(buf, wire::kHeaderSize));
}

TEST(FabricWire, ConnectRoundTripAndTruncation) {
  wire::Connect c{0x10011, "tcp;ofi_rxm", {1, 2, 3, 4}};
  auto bytes = wire::EncodeConnect(c);
  auto d = wire::DecodeConnect(bytes.data(), bytes.size());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->provider, c.provider);
  EXPECT_EQ(d->address, c.address);
  EXPECT_FALSE(wire::DecodeConnect(bytes.data(), bytes.size() - 1));
}

}  // namespace
}  // namespace tandem::fabric

int main(int argc, char** argv) {
  // shm's cross-memory attach needs ptrace rights that containers drop (FABRIC-NOTES).
  setenv("FI_SHM_DISABLE_CMA", "1", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
