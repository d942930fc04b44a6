// The client runtime shared by both front ends: the list of servers and their devices,
// one Session per server, batching of asynchronous commands, matching of replies, and
// bulk transfers. No CUDA or OpenCL headers here: front ends translate to their API.
//
// Threading: any application thread may post or call. One receiver thread per process
// reads replies and runs reply callbacks, except while a thread blocked in a call reads for
// its own reply and routes what it reads meanwhile; callbacks must not block on the network.
// Asynchronous commands are queued and sent as one batch at the next sync point, at an
// explicit Flush(), when the batch grows large, or once its first command is 100 us old:
// by the next command posted then, or else by the flusher thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/fabric/fabric.h"
#include "tandem/ir/codec.h"
#include "tandem/status.h"

namespace tandem::client {

using Millis = std::chrono::milliseconds;
using RawReplyFn = std::function<void(const Status& status, std::span<const uint8_t> fields)>;
template <class Rep>
using ReplyFn = std::function<void(const Status& status, Rep&& reply)>;

class Session;

// One remote device as a front end sees it.
struct Device {
  uint32_t index = 0;         // position in Runtime::Devices(api)
  Session* session = nullptr;
  uint32_t remote_index = 0;  // the device's index on its server: the `device` field of commands
  ir::DeviceInfoRep info;     // api mask, name, platform, backend-defined properties
  // The value of a property, or nullptr when the server did not report it.
  const ir::bytes* Prop(uint32_t key) const;
  template <class T>
  bool PropAs(uint32_t key, T* out) const {
    const ir::bytes* b = Prop(key);
    if (!b || b->size() != sizeof(T)) return false;
    std::memcpy(out, b->data(), sizeof(T));
    return true;
  }
};

class Session {
 public:
  virtual ~Session() = default;
  virtual const std::string& server() const = 0;  // "host:port" as given in TANDEM_SERVERS
  virtual const std::string& backend() const = 0;
  // "host:port" of this session's worker as this process reaches it; another server's worker
  // pulls server-to-server copies from there.
  virtual const std::string& worker_address() const = 0;

  // Queues a command. With a reply function, the server answers it and `fn` runs on the
  // receiver thread; without, failures come back as deferred errors at the next sync.
  virtual uint64_t PostRaw(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) = 0;
  // The same for a command whose reply the posting thread waits for before it does anything
  // else (CallRaw). A session all of whose commands came from that one thread, in a program
  // whose front end runs no thread of its own that posts or calls back (NoteHelperThreads),
  // marks it ir::kRecordCallerWaits: nothing else of the program's should need the server's
  // session until the reply, so the server may wait for the device on its executor instead
  // of handing the wait to another thread. Fault tolerance's groups post it as PostRaw does;
  // its recovery calls a member's CallRaw itself, which is flagged only while that thread is
  // the member's sole poster, and the program's posts wait for the recovery meanwhile.
  virtual uint64_t PostRawAwaited(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) {
    return PostRaw(opcode, std::move(payload), std::move(fn));
  }
  // Sends what is queued.
  virtual Status Flush() = 0;
  // Flushes, then waits for the reply to `seq` (which must have been posted with a reply fn
  // by CallRaw). Used by Call().
  virtual Status CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) = 0;
  // CallRaw (as every session's, PostAndWait), unlocking `held`, which must be locked, once
  // the command is posted and flushed, before waiting for its reply: nothing that other
  // threads post under `held` can come between what this thread did under it and the
  // command, and they need not wait for the reply.
  Status CallRawReleasing(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields,
                          std::unique_lock<std::mutex>& held);

  // Registers client memory so the server can reach it by RMA (nullptr result if the
  // transport has no RMA: callers then send data inline in pieces).
  virtual Result<std::unique_ptr<fabric::MemoryRegion>> Register(const void* addr, size_t len, uint32_t access) = 0;
  virtual bool rma() const = 0;

  // Errors of asynchronous commands that the server reported and nobody has taken yet.
  virtual std::vector<ir::AsyncError> TakeAsyncErrors() = 0;
  // Not ok once the server or the link is lost for good.
  virtual Status health() const = 0;

  template <class Req>
  uint64_t Post(const Req& req) {
    return PostRaw(static_cast<uint16_t>(Req::kOpcode), ir::Encode(req), nullptr);
  }
  // `awaited`: the posting thread waits for the reply before it does anything else (a blocking
  // read or write): PostRawAwaited.
  template <class Req>
  uint64_t Post(const Req& req, ReplyFn<typename Req::Reply> fn, bool awaited = false) {
    const auto opcode = static_cast<uint16_t>(Req::kOpcode);
    RawReplyFn raw = Decoding<Req>(std::move(fn));
    return awaited ? PostRawAwaited(opcode, ir::Encode(req), std::move(raw))
                   : PostRaw(opcode, ir::Encode(req), std::move(raw));
  }
  template <class Req>
  Result<typename Req::Reply> Call(const Req& req) {
    std::vector<uint8_t> fields;
    Status st = CallRaw(static_cast<uint16_t>(Req::kOpcode), ir::Encode(req), &fields);
    return Replied<Req>(st, fields);
  }
  // Call, unlocking `held` once the command is posted (CallRawReleasing).
  template <class Req>
  Result<typename Req::Reply> Call(const Req& req, std::unique_lock<std::mutex>& held) {
    std::vector<uint8_t> fields;
    Status st = CallRawReleasing(static_cast<uint16_t>(Req::kOpcode), ir::Encode(req), &fields, held);
    return Replied<Req>(st, fields);
  }

 private:
  // A call's outcome: its error, or its reply decoded from its fields.
  template <class Req>
  static Result<typename Req::Reply> Replied(const Status& st, std::span<const uint8_t> fields) {
    if (!st.ok()) return st;
    typename Req::Reply rep{};
    TANDEM_RETURN_IF_ERROR(Decode<Req>(fields, &rep));
    return rep;
  }
  // Req's reply from its fields: all of them, and nothing after (kProtocol otherwise).
  template <class Req>
  static Status Decode(std::span<const uint8_t> fields, typename Req::Reply* rep) {
    ir::Reader r(fields);
    if (!ir::Get(r, rep) || r.remaining())
      return Status::Protocol(std::string("malformed reply to ") + std::string(Req::kName));
    return Status::Ok();
  }
  // A reply function that decodes Req's reply (a malformed one fails with kProtocol).
  template <class Req>
  static RawReplyFn Decoding(ReplyFn<typename Req::Reply> fn) {
    return [fn = std::move(fn)](const Status& st, std::span<const uint8_t> fields) {
      typename Req::Reply rep{};
      Status s = st.ok() ? Decode<Req>(fields, &rep) : st;
      fn(s, std::move(rep));
    };
  }
};

class Runtime {
 public:
  // The process-wide runtime. The first call connects to TANDEM_SERVERS (never call it
  // from a static constructor: CUDA registration must not block on the network).
  static Runtime& Get();
  virtual ~Runtime() = default;

  // Ok if at least one server answered; otherwise why none did.
  virtual Status status() const = 0;
  // Every device that speaks `api`, in TANDEM_SERVERS order, then server order (for CUDA,
  // as CUDA_VISIBLE_DEVICES filters and orders them). `api` may also be a mask of APIs.
  virtual std::vector<Device*> Devices(Api api) = 0;
  // A fresh 64-bit handle, unique in this process.
  virtual uint64_t NewHandle() = 0;
  // Sends everything queued on every session.
  virtual void FlushAll() = 0;
  // Ends every session cleanly (Goodbye); called at exit.
  virtual void Shutdown() = 0;
};

// ---- bulk helpers used by both front ends -----------------------------------------------

// Writes host memory into a buffer. Small writes travel inline; large ones by RMA from
// `src` (registered for the duration). With blocking, returns once `src` may be reused;
// otherwise `src` must stay valid until `done` runs (done may be empty). Of both helpers:
// `done` runs also when the call fails, with the error (it may run before the call returns),
// so whatever it ends is ended once posting failed too.
Status WriteBuffer(Session& s, ir::BufferWriteReq req, const void* src, bool blocking,
                   std::function<void(const Status&)> done = {});
// Reads a buffer range into host memory. With blocking, returns when `dst` holds the data;
// otherwise `done` runs (where replies are routed) once it does.
Status ReadBuffer(Session& s, ir::BufferReadReq req, void* dst, bool blocking,
                  std::function<void(const Status&)> done = {});

// One end of a copy between two servers: which session, stream, buffer (0: absolute CUDA
// address in `offset`) and the events the command waits for on that server.
struct CopyEnd {
  Session* session = nullptr;
  uint64_t stream = 0;
  uint64_t buffer = 0;
  uint64_t offset = 0;
  std::vector<uint64_t> wait;
};
// False when TANDEM_VDMA=0: copies between servers are then relayed through this process.
bool DirectCopiesEnabled();
// Called by a front end before it first runs a thread of its own that posts commands or calls
// the program back (OpenCL's event and destructor callbacks): from then on no session marks a
// command ir::kRecordCallerWaits (Session::PostRawAwaited), for that thread may need the
// server while the program's thread waits.
void NoteHelperThreads();
// Copies `size` bytes between buffers of two servers (or two devices of one), in each side's stream order;
// `signal` (0: none) completes on the destination when the bytes are there. Directly (VDMA):
// the destination server pulls them from the source server and nothing here waits. Relayed
// (TANDEM_VDMA=0): a blocking read into this process, then an asynchronous write.
Status CopyBetweenServers(const CopyEnd& src, const CopyEnd& dst, uint64_t size, uint64_t signal);

// Makes `event` of session `from` usable in wait lists on session `to`: `stand_in` (a fresh
// handle) becomes an event of `to`'s device `device` that completes, or fails, when `event`
// does on `from`, told server to server (ir EventExport / EventImport); nothing here waits.
// kUnimplemented when direct links are off (TANDEM_VDMA=0, fault tolerance): the caller then
// waits for the event itself. The caller destroys the stand-in (EventDestroy on `to`).
Status ImportEvent(Session& from, uint64_t event, Session& to, uint32_t device, uint64_t stand_in);

// The stand-ins of one event on other sessions (ImportEvent), made once per session and
// destroyed together: when the event goes, or (CUDA) is recorded again. The owner locks.
class StandIns {
 public:
  // The stand-in of `event` (of `from`) on `to`'s device `device`, made on first use; 0 when
  // it cannot be (direct links are off): the caller then waits for the event itself.
  uint64_t On(Session& from, uint64_t event, Session& to, uint32_t device);
  // Destroys every stand-in (EventDestroy on its session).
  void Drop();

 private:
  std::vector<std::pair<Session*, uint64_t>> made_;
};

// Parses TANDEM_SERVERS ("host:port[,host:port...]"). Exposed for tests and `tandem info`.
std::vector<std::string> ParseServerList(const std::string& list);

// One TANDEM_SERVERS entry: "host:port" (every device of the server) or "host:port/N" (its
// device N). A server named in several entries gets one session; the device list follows
// the entries' order.
struct ServerSpec {
  std::string address;
  std::optional<uint32_t> device;
};
bool ParseServerSpec(const std::string& entry, ServerSpec* out);

// Which of `n` CUDA devices a program sees, in order, under CUDA_VISIBLE_DEVICES (unset:
// all). As CUDA does, the list ends at the first entry that is not a valid, unused index.
std::vector<size_t> VisibleDevices(const char* cuda_visible_devices, size_t n);
// The auth token from TANDEM_TOKEN or the file named by TANDEM_TOKEN_FILE ("" if none).
std::string TokenFromEnv();

}  // namespace tandem::client
