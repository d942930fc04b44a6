// Server-to-server copies over the worker's own fabric endpoint (ir PeerSend / PeerRecv).
//
// Pull model: the destination worker, when its executor reaches PeerRecv, connects to the
// source worker and sends PeerPull{transfer, size}; the source worker's PeerSend (in its own
// stream order) waits for that pull, then streams the bytes as PeerData chunks. So bulk data
// only ever flows to a worker that asked for a transfer its own client ordered, and a
// transfer id (64 random bits chosen by the client) is the only capability a puller needs.
//
// Threads: the worker's receive thread hands peer messages to OnMessage/OnPeerLost; the
// executor calls Source/Sink and then drives the returned BulkIO.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>

#include "tandem/fabric/fabric.h"
#include "tandem/server/session.h"

namespace tandem::server {

class FabricPeerLink final : public PeerLink {
 public:
  static constexpr size_t kChunk = 4u << 20;
  // Pull requests waiting for their PeerSend (a bound against a flood of bogus ids).
  static constexpr size_t kMaxPendingPulls = 1024;

  FabricPeerLink(fabric::Endpoint* endpoint, fabric::Millis timeout);

  Result<std::unique_ptr<BulkIO>> Source(uint64_t transfer, uint64_t size) override;
  Result<std::unique_ptr<BulkIO>> Sink(const std::string& peer, uint64_t transfer, uint64_t size) override;

  // A message from a peer other than the session's client. False when it is not a valid
  // peer message (the caller refuses the peer).
  bool OnMessage(fabric::PeerId peer, std::vector<uint8_t>&& message);
  void OnPeerLost(fabric::PeerId peer, const Status& why);

 private:
  friend class PeerSource;
  friend class PeerSink;
  struct Pull {
    fabric::PeerId peer;
    uint64_t size;
  };
  struct Chunk {  // bytes [at, at + len) of the message they came in
    uint64_t offset;
    std::shared_ptr<const std::vector<uint8_t>> message;
    size_t at, len;
    const uint8_t* data() const { return message->data() + at; }
  };
  struct Inbox {
    fabric::PeerId from = 0;
    std::deque<Chunk> chunks;
    Status failed;
  };

  Result<fabric::PeerId> ConnectTo(const std::string& peer);
  Status SendPull(fabric::PeerId peer, uint64_t transfer, uint64_t size);
  // The next chunk of an inbox, waiting at most the timeout.
  Result<Chunk> NextChunk(uint64_t transfer);
  void CloseInbox(uint64_t transfer);

  fabric::Endpoint* endpoint_;
  fabric::Millis timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, fabric::PeerId> connections_;  // workers this one connected to
  std::set<fabric::PeerId> outgoing_;
  std::map<uint64_t, Pull> pulls_;     // source side: transfer -> who pulls it
  std::map<uint64_t, Inbox> inboxes_;  // destination side: transfers being received
};

}  // namespace tandem::server
