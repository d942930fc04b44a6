// Server-to-server copies over the worker's own fabric endpoint (ir PeerSend / PeerRecv).
//
// Pull model: the destination worker, when its executor reaches PeerRecv, connects to the
// source worker and sends PeerPull{transfer, size}; the source worker's PeerSend (in its own
// stream order) waits for that pull, then streams the bytes as PeerData chunks. So bulk data
// only ever flows to a worker that asked for a transfer its own client ordered, and a
// transfer id (64 random bits chosen by the client) is the only capability a puller needs.
//
// By RMA: a puller of at least kRmaMinBytes sends PeerPullRma instead, and the source answers
// with PeerRegions, bytes [offset, +len) registered for the puller to read itself (the
// provider's zero-copy path, not our message framing, fragmenting and reassembly); after each
// read the puller sends PeerRelease. An asynchronous source (Offer) holds the whole transfer in
// host memory and lends it as one region, freed on its release; a streaming source (Source,
// the executor reading the device chunk by chunk) fills a ring of kSlots registered chunks,
// one region each, and each release frees a slot for the next chunk. A source that cannot
// register memory answers with PeerData, which every puller still takes.
//
// Asynchronous transfers have no deadline: either side may be far ahead of the other, as long
// as the program keeps the other's stream busy. A lost link fails what depends on it, and a
// source that fails, or gave up waiting for a pull on the blocking path, answers PeerAbort.
// Only the blocking path, which holds an executor, gives up after the timeout.
//
// Cross-server event waits follow the same pull model: the importing worker connects to the
// exporting one and sends PeerWatch{token}; the exporter answers PeerSignal{token, status} once
// the exported event is done (ExportDone), whichever of the two comes first.
//
// Threads: the worker's receive thread hands peer messages to OnMessage/OnPeerLost; the
// executor calls Source/Sink/Import and then drives the returned BulkIO; ExportDone comes
// from whatever thread the backend reports completions on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "tandem/fabric/fabric.h"
#include "tandem/server/session.h"

namespace tandem::server {

class FabricPeerLink final : public PeerLink {
 public:
  static constexpr size_t kChunk = 4u << 20;
  // Chunks a streaming source may have read ahead of its puller's RMA reads.
  static constexpr size_t kSlots = 4;
  // Asynchronous transfers from this size on are read by RMA; smaller ones come as one
  // PeerData message, which saves the read's own round trip (in process over tcp, 2 cores:
  // 4 KiB 76 against 233 us, 256 KiB about even, 1 MiB 0.66 against 0.52 ms, 4 MiB 4.0
  // against 1.5 ms).
  static constexpr size_t kRmaMinBytes = 512u << 10;
  // Pull requests waiting for their PeerSend (a bound against a flood of bogus ids).
  static constexpr size_t kMaxPendingPulls = 1024;
  // Exported events nobody watches yet, and watches of tokens not exported yet (the same kind
  // of bound: each import makes one of each, and they meet within a few commands).
  static constexpr size_t kMaxPendingExports = 65536;

  FabricPeerLink(fabric::Endpoint* endpoint, fabric::Millis timeout);
  ~FabricPeerLink() override;

  Result<std::unique_ptr<BulkIO>> Source(uint64_t transfer, uint64_t size) override;
  Result<std::unique_ptr<BulkIO>> Sink(const std::string& peer, uint64_t transfer, uint64_t size) override;
  void ExportDone(uint64_t token, int32_t status) override;
  Status Import(const std::string& peer, uint64_t token, std::function<void(int32_t status)> done) override;
  void Offer(uint64_t transfer, uint64_t size, Result<std::shared_ptr<HostBuffer>> bytes) override;
  Status Expect(const std::string& peer, uint64_t transfer, std::shared_ptr<HostBuffer> into,
                std::function<void(const Status&)> done) override;

  // A message from a peer other than the session's client. False when it is not a valid
  // peer message: everything waiting on that peer has then failed as by OnPeerLost, and the
  // caller refuses the peer.
  bool OnMessage(fabric::PeerId peer, std::vector<uint8_t>&& message);
  void OnPeerLost(fabric::PeerId peer, const Status& why);

  // Tests and the fuzzer: waits until no transfer waits for the sender or reader thread and
  // neither works on one; false if that takes longer than `limit`.
  bool WaitIdle(std::chrono::milliseconds limit);

  // What tests look at: transfers this worker read by RMA, and host copies it lends right now.
  uint64_t rma_reads() const { return rma_reads_.load(); }
  size_t lent() {
    std::lock_guard<std::mutex> lock(mu_);
    return lent_.size();
  }

 private:
  friend class PeerSource;
  friend class PeerSink;
  struct Pull {
    fabric::PeerId peer;
    uint64_t size;
    bool rma = false;  // PeerPullRma: a PeerRegion may answer it
  };
  // Bytes [offset, +len) of a transfer: [at, at + len) of the message they came in, or (remote)
  // a PeerRegion of the source's to read.
  struct Chunk {
    uint64_t offset;
    std::shared_ptr<const std::vector<uint8_t>> message;
    size_t at, len;
    bool remote = false;
    fabric::RemoteRegion region;
    const uint8_t* data() const { return message->data() + at; }
  };
  // How an expected transfer read by RMA ends: once, on whichever thread sees it end first.
  struct Outcome {
    std::mutex m;
    std::function<void(const Status&)> done;
    uint64_t size = 0, read = 0;
    bool finished = false;
    void Finish(const Status& st);
    void Read(uint64_t n);  // finishes once every byte is read
    bool over() {
      std::lock_guard<std::mutex> lock(m);
      return finished;
    }
  };
  // An exported event: finished or not, and who watches it (watched before it was exported,
  // or exported and finished before anyone watched).
  struct Exported {
    bool done = false;
    int32_t status = 0;
    std::optional<fabric::PeerId> watcher;
  };
  // An imported event: the worker that answers for it and what to do with the answer.
  struct Imported {
    fabric::PeerId from = 0;
    std::function<void(int32_t status)> done;
  };
  struct Inbox {
    fabric::PeerId from = 0;
    std::deque<Chunk> chunks;
    Status failed;
  };
  using Clock = std::chrono::steady_clock;
  // Asynchronous transfers. Source side: bytes read (or why not) waiting for their pull.
  struct Offered {
    uint64_t size = 0;
    Result<std::shared_ptr<HostBuffer>> bytes{Status::Ok()};
  };
  // Destination side: where the bytes go, how many came (PeerData) or are being read
  // (PeerRegions: then `outcome` ends it), and who hears the outcome.
  struct Expected {
    fabric::PeerId from = 0;
    std::shared_ptr<HostBuffer> into;
    uint64_t received = 0;
    std::function<void(const Status&)> done;
    std::shared_ptr<Outcome> outcome;
    // What ends the transfer with a failure (its `done`, or its outcome's once reads began).
    std::function<void(const Status&)> Ender() {
      if (outcome) return [o = outcome](const Status& st) { o->Finish(st); };
      return std::move(done);
    }
  };
  // One transfer for the sender thread: its bytes, or why the source could not read them.
  struct SendJob {
    fabric::PeerId to = 0;
    uint64_t transfer = 0;
    Result<std::shared_ptr<HostBuffer>> bytes{Status::Ok()};
    bool rma = false;
  };
  // Source side: a host copy registered for a puller's RMA read, until its PeerRelease.
  struct Lent {
    fabric::PeerId to = 0;
    std::shared_ptr<HostBuffer> bytes;
    std::unique_ptr<fabric::MemoryRegion> region;
  };
  // Destination side: a PeerRegion to read into an expected transfer's host copy at `offset`.
  struct ReadJob {
    fabric::PeerId from = 0;
    uint64_t transfer = 0;
    fabric::RemoteRegion region;
    std::shared_ptr<HostBuffer> into;
    uint64_t offset = 0;
    std::shared_ptr<Outcome> outcome;
  };
  // Source side: a streamed transfer's ring slots its puller has released.
  struct Stream {
    fabric::PeerId to = 0;
    uint64_t released = 0;
    Status failed;
  };

  // What OnMessage does once its lock is released, in this order.
  struct Deferred {
    struct Copy {  // the shared pointers keep both ends alive
      std::shared_ptr<HostBuffer> buffer;
      uint8_t* to;
      std::shared_ptr<const std::vector<uint8_t>> message;
      const uint8_t* from;
      size_t n;
    };
    std::vector<Copy> copies;  // PeerData into an expected transfer's buffer
    std::vector<ir::PeerSignalReq> answers;
    std::vector<std::pair<std::function<void(int32_t)>, int32_t>> outcomes;
    std::vector<std::pair<std::function<void(const Status&)>, Status>> finished;
    std::vector<uint64_t> releases;  // PeerRelease of regions nobody here reads (any more)
    std::vector<Lent> released;      // deregistered and let go outside the lock
    std::vector<ir::PeerAbortReq> aborts;  // pulls of transfers that failed here
  };
  // One record of a peer's message, with mu_ held. False: not a valid peer record.
  bool TakeRecord(fabric::PeerId peer, const ir::Record& rec, const std::shared_ptr<const std::vector<uint8_t>>& owner,
                  Deferred* after);
  Result<fabric::PeerId> ConnectTo(const std::string& peer);
  Status SendPull(fabric::PeerId peer, uint64_t transfer, uint64_t size, bool rma = false);
  // Sends one peer command on its own (false when the peer is gone; logged).
  template <class Req>
  bool SendAlone(fabric::PeerId peer, const Req& req);
  // A pulled transfer whose bytes are ready goes to the sender thread. mu_ held.
  // `pulled`: the size the puller asked for (a mismatch fails the transfer).
  void QueueSend(fabric::PeerId to, uint64_t transfer, uint64_t size, uint64_t pulled,
                 Result<std::shared_ptr<HostBuffer>> bytes, bool rma);
  template <class Table>
  static auto TakeFrom(Table& table, fabric::PeerId peer);
  // A PeerRegion for an expected (asynchronous) transfer: queued for the reader. mu_ held.
  void TakeRegion(fabric::PeerId peer, uint64_t transfer, uint64_t offset, const fabric::RemoteRegion& region,
                  Deferred* after);
  // The sender thread: sends queued transfers.
  void SendLoop();
  void SendTransfer(const SendJob& job);
  // Lends the bytes of a transfer to its puller's RMA read; false when they cannot be
  // registered (the caller streams them instead).
  bool Lend(const SendJob& job);
  // The reader thread: reads PeerRegions into their transfers' host copies, one at a time.
  void ReadLoop();
  void ReadTransfer(ReadJob& job);
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
  std::map<uint64_t, Exported> exports_;  // token -> exported event
  std::map<uint64_t, Imported> imports_;  // token -> imported event
  std::map<uint64_t, Offered> offers_;    // async source side: transfer -> bytes, before the pull
  std::map<uint64_t, Expected> expected_;  // async destination side: transfers being received
  std::deque<SendJob> sends_;
  std::map<uint64_t, Lent> lent_;     // source side: transfers a puller reads by RMA
  std::deque<ReadJob> reads_;         // destination side: regions to read
  std::map<uint64_t, Stream> streams_;  // source side: streamed transfers read by RMA
  std::map<uint64_t, Status> failed_;   // source side: see Failed()
  std::deque<uint64_t> failed_order_;
  // Registered memory of the link's own, made once (Ring): the kSlots chunks a streaming
  // source fills, and the two a streaming sink reads into. Each serves one transfer at a time
  // (the executor's), under its own lock.
  struct RingMemory {
    std::mutex use;
    std::unique_ptr<uint8_t[]> bytes;
    std::unique_ptr<fabric::MemoryRegion> region;
  };
  RingMemory source_ring_, sink_ring_;
  // Registers `ring` (slots chunks) once; its `use` lock held.
  Status Ring(RingMemory& ring, size_t slots, uint32_t access);
  // A transfer that failed here before its puller asked: the pull is answered PeerAbort.
  // mu_ held; the last kMaxPendingPulls are remembered.
  void Failed(uint64_t transfer, const Status& why);
  // A streaming source waits until its puller released `count` regions of `transfer`.
  Status AwaitReleases(uint64_t transfer, uint64_t count);
  // Reads that outlived the timeout: their transfers failed, but the provider may still
  // write into their memory, so it is kept until the read ends (reader thread only).
  struct StuckRead {
    fabric::OpId op;
    std::unique_ptr<fabric::MemoryRegion> region;
    std::shared_ptr<HostBuffer> into;
  };
  std::vector<StuckRead> stuck_;
  std::atomic<uint64_t> rma_reads_{0};
  bool stopping_ = false;
  int busy_ = 0;  // jobs the sender and reader threads have taken and not finished (mu_)
  std::thread sender_;
  std::thread reader_;
};

}  // namespace tandem::server
