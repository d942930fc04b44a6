// A minimal Tandem client for tests, written on fabric and the IR codec only (the real
// client runtime is tested elsewhere): it connects, sends batches it builds (or raw bytes)
// and reads the replies of one peer.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tandem/fabric/fabric.h"
#include "tandem/ir/codec.h"

namespace tandem::test {

using namespace std::chrono_literals;

// One decoded reply record.
template <class Rep>
struct Answer {
  Status transport;  // not OK when no reply came or it could not be decoded
  ir::ReplyHead head;
  Rep rep;
  const Status& status() const { return transport.ok() ? head.status : transport; }
};

// The records of one reply batch; `records` point into `msg`.
struct ReplyBatch {
  Status status;
  std::vector<uint8_t> msg;
  std::vector<ir::Record> records;
  // The status of record i (decoding only its head).
  Status RecordStatus(size_t i, ir::ReplyHead* head = nullptr) const {
    ir::ReplyHead h;
    ir::Reader r(records.at(i).payload);
    Status st = ir::DecodeReplyHead(r, &h);
    if (!st.ok()) return st;
    if (head) *head = h;
    return h.status;
  }
};

class TestClient {
 public:
  TestClient() {
    auto ep = fabric::Endpoint::Open(fabric::Options{});
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    if (ep.ok()) ep_ = std::move(ep.value());
  }
  fabric::Endpoint& ep() { return *ep_; }

  Result<fabric::PeerId> Connect(const std::string& host_port) { return ep_->Connect(host_port, 5000ms); }

  // Sends raw bytes and waits for the next message from that peer.
  ReplyBatch Exchange(fabric::PeerId peer, std::vector<uint8_t> bytes, std::chrono::milliseconds timeout = 30s) {
    Status st = ep_->Send(peer, std::move(bytes));
    if (!st.ok()) return ReplyBatch{st, {}, {}};
    return Receive(peer, timeout);
  }
  // The replies to `records` records, which may come in several messages: a reply that
  // waits on the device (a read back, a synchronize) leaves after its batch's others.
  std::vector<ReplyBatch> ExchangeAll(fabric::PeerId peer, std::vector<uint8_t> bytes, size_t records,
                                      std::chrono::milliseconds timeout = 30s) {
    std::vector<ReplyBatch> out;
    out.push_back(Exchange(peer, std::move(bytes), timeout));
    size_t got = out.back().records.size();
    while (out.back().status.ok() && got < records) {
      out.push_back(Receive(peer, timeout));
      got += out.back().records.size();
    }
    return out;
  }

  ReplyBatch Receive(fabric::PeerId peer, std::chrono::milliseconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return ReplyBatch{Status(Code::kTimeout, "no reply"), {}, {}};
      auto ev = ep_->Next(left);
      if (!ev.ok()) {
        if (ev.status().code() == Code::kTimeout) continue;
        return ReplyBatch{ev.status(), {}, {}};
      }
      if (ev->peer != peer) continue;
      if (ev->kind == fabric::EventKind::kPeerLost) return ReplyBatch{ev->status, {}, {}};
      ReplyBatch b;
      b.msg = std::move(ev->data);
      b.status = ir::ParseBatch(b.msg, ir::BatchKind::kReplies, &b.records);
      return b;
    }
  }

  // One request as one batch; its one reply decoded.
  template <class Req>
  Answer<typename Req::Reply> Call(fabric::PeerId peer, const Req& req, uint16_t flags = 0,
                                   std::chrono::milliseconds timeout = 60s) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    w.AddRequest(req, ++seq_, flags);
    return Decode<Req>(Exchange(peer, w.Finish(), timeout));
  }

  template <class Req>
  static Answer<typename Req::Reply> Decode(const ReplyBatch& b, size_t index = 0) {
    Answer<typename Req::Reply> a;
    if (!b.status.ok()) {
      a.transport = b.status;
      return a;
    }
    if (index >= b.records.size()) {
      a.transport = Status::Protocol("reply batch has too few records");
      return a;
    }
    a.transport = ir::DecodeReply(b.records[index].payload, &a.head, &a.rep);
    return a;
  }

  uint64_t next_seq() { return ++seq_; }

 private:
  std::unique_ptr<fabric::Endpoint> ep_;
  uint64_t seq_ = 0;
};

// A session opened through the broker: Hello, connect to the worker, Attach.
struct SessionConn {
  fabric::PeerId broker = 0;
  fabric::PeerId worker = 0;
  ir::HelloRep hello;
  ir::AttachRep attach;
};

inline Result<SessionConn> OpenSession(TestClient& c, const std::string& server, const std::string& token = "") {
  SessionConn s;
  auto b = c.Connect(server);
  if (!b.ok()) return b.status();
  s.broker = b.value();
  ir::HelloReq hello{ir::kMagic, ir::kProtocolVersion, ir::kFeatureRma | ir::kFeatureOpenCL, token, "server-test"};
  auto h = c.Call(s.broker, hello);
  if (!h.status().ok()) return h.status();
  s.hello = h.rep;
  auto w = c.Connect(fmt::format("127.0.0.1:{}", s.hello.session_port));
  if (!w.ok()) return w.status();
  s.worker = w.value();
  auto a = c.Call(s.worker, ir::AttachReq{s.hello.session_key});
  if (!a.status().ok()) return a.status();
  s.attach = a.rep;
  return s;
}

}  // namespace tandem::test
