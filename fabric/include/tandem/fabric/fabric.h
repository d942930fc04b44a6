// Tandem's transport: libfabric RDM endpoints behind a small, provider-neutral interface.
//
// `fabric` knows nothing of GPUs or of the IR: it moves opaque messages between peers and
// moves bulk data by RMA between registered memory regions. It never assumes tcp: the
// provider comes from TANDEM_FABRIC_PROVIDER (then FI_PROVIDER, then "tcp"), and every MR
// mode the provider asks for (FI_MR_LOCAL, VIRT_ADDR, PROV_KEY, ENDPOINT, ALLOCATED) is
// honoured. See ../shared/FABRIC-NOTES.md.
//
// Model: one Endpoint per process (a listening server, or a client). Peers are "connected"
// by a small fabric-level handshake (the connector sends its raw address; the listener
// inserts it into its address vector), after which either side may Send() messages of any
// size (large ones are fragmented and reassembled) and the listener learns each message's
// sender as a PeerId. Incoming traffic is read with Next().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/status.h"

namespace tandem::fabric {

using PeerId = uint64_t;
using Millis = std::chrono::milliseconds;
using Micros = std::chrono::microseconds;  // Next() takes it: a waiting caller may look for less than 1 ms

struct Options {
  // Provider name ("tcp", "verbs", "shm", "net", ...). Empty: TANDEM_FABRIC_PROVIDER, then
  // FI_PROVIDER, then "tcp". "tcp" on libfabric 1.17 is the native TCP RDM "net" where it is
  // offered, else "tcp;ofi_rxm" (which may also be named).
  std::string provider;
  // "host:port" to listen on; port 0 picks a free one. Empty: a client endpoint bound to an
  // ephemeral port of any local address.
  std::string listen;
  // Largest single fabric message; Send() fragments anything larger.
  size_t max_message = 1u << 20;
  // Receive buffers posted (each max_message bytes).
  int recv_buffers = 8;
  // Microseconds the progress thread busy-polls after activity before it blocks.
  int spin_us = 100;
  // A one-frame message (up to max_message) from a thread that has sent nothing for this many
  // microseconds is sent by the progress thread when that one is busy-polling: a thread that slept is slow in the
  // kernel's send path (45 against 11 us for a tcp loopback send after a 20 ms sleep, H100
  // VM), a busy-polling one is not. 0 (the default): every caller sends its own messages.
  int hand_off_idle_us = 0;
  // How long a peer may take nothing (a dead or frozen one) before it is declared lost. Send()
  // does not wait for it: a frame the provider refuses is posted later by the progress thread,
  // and the loss comes as a kPeerLost event (only a sender with several frames waiting for that
  // peer waits, at most this long).
  Millis send_timeout{10000};
};

// A registered local memory region (RAII: deregistered on destruction).
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  // What a peer needs to reach this region with RMA: the address or offset the provider
  // expects (FI_MR_VIRT_ADDR or not) for byte 0 of the region, its length, its key.
  virtual uint64_t remote_addr() const = 0;
  virtual uint64_t key() const = 0;
  virtual void* base() const = 0;
  virtual size_t length() const = 0;
};

// A region of a peer's memory, as the peer described it (remote_addr() / key() above).
struct RemoteRegion {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint64_t key = 0;
};

enum class EventKind { kMessage, kPeerLost };

struct Event {
  EventKind kind = EventKind::kMessage;
  PeerId peer = 0;
  std::vector<uint8_t> data;  // kMessage: one whole (reassembled) message
  Status status;              // kPeerLost: why
};

enum Access : uint32_t { kRemoteRead = 1, kRemoteWrite = 2, kLocal = 4 };

using OpId = uint64_t;

class Endpoint {
 public:
  static Result<std::unique_ptr<Endpoint>> Open(const Options& options);
  virtual ~Endpoint() = default;

  // The provider stack actually in use, e.g. "tcp;ofi_rxm", and the libfabric version.
  virtual std::string provider() const = 0;
  // "host:port" this endpoint listens on (the real port when 0 was asked for).
  virtual std::string address() const = 0;
  virtual uint16_t port() const = 0;

  // Connects to a listening endpoint. Errors: kLinkLost (refused / unreachable),
  // kTimeout (no answer within the timeout), kInvalidArgument (bad "host:port").
  virtual Result<PeerId> Connect(const std::string& host_port, Millis timeout) = 0;
  // Forgets a peer: its later messages are dropped and its address is removed.
  virtual void Close(PeerId peer) = 0;

  // Queues one message of any size for the peer; returns once the data is copied or posted
  // (the caller may reuse `data`'s storage). Delivery is reliable and in order per peer.
  virtual Status Send(PeerId peer, std::vector<uint8_t> data) = 0;
  // The next incoming whole message or peer failure. kTimeout when nothing came in time.
  virtual Result<Event> Next(Micros timeout) = 0;
  // Wakes a thread blocked in Next() (it returns kTimeout).
  virtual void Interrupt() = 0;
  // How many messages so far went out from the progress thread (Options::hand_off_idle_us).
  virtual uint64_t sends_handed_off() const { return 0; }
  // Changes how long the progress thread and Next() look for work before sleeping
  // (Options::spin_us). Longer spinning trades CPU for wake-up latency (keepalive).
  virtual void SetSpin(int us) = 0;

  // Registers local memory for RMA. Registration is done once per region; callers cache it.
  virtual Result<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len, uint32_t access) = 0;

  // RMA, one-sided, driven by this side: copies `len` bytes between local memory (inside a
  // region this endpoint registered, at local_offset) and the peer's region (at
  // remote_offset). Posted in chunks with several in flight; Wait() returns when every
  // chunk has completed (an RMA write is complete at the target when Wait returns).
  virtual Result<OpId> PostRead(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                                uint64_t remote_offset, size_t len) = 0;
  virtual Result<OpId> PostWrite(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                                 uint64_t remote_offset, size_t len) = 0;
  virtual Status Wait(OpId op, Millis timeout) = 0;
  // Whether the provider may still touch an operation's memory: true until every chunk of it
  // has completed, also after a Wait that returned an error (one failed chunk ends the Wait
  // while others are still out).
  virtual bool InFlight(OpId op) = 0;

  // Blocking conveniences built on the above.
  Status Read(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
              uint64_t remote_offset, size_t len, Millis timeout);
  Status Write(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
               uint64_t remote_offset, size_t len, Millis timeout);
};

// Splits "host:port" (IPv6 as "[addr]:port"). False on a malformed string.
bool SplitHostPort(const std::string& host_port, std::string* host, std::string* port);

// The provider name Open() will use given the environment (for messages and `tandem info`).
std::string ProviderFromEnv();

// The libfabric version this process runs, "major.minor" (for messages and `tandem info`).
std::string LibfabricVersion();

}  // namespace tandem::fabric
