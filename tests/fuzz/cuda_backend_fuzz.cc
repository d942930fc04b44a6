// Feeds a session's worth of commands with arbitrary fields straight to the CUDA backend on the
// machine's GPU: allocations at addresses inside, across and outside the reserved range;
// copies, fills, rectangular copies and digests by buffer and by absolute address (buffer 0)
// with sizes and offsets past every end and near 2^64; module loads of the test fatbinary and
// of garbage; functions by real and unknown names; launches of a real kernel with arguments of
// every wrong count, size and kind and with wrong shapes; streams, events, user events, wait
// lists of unknown and failed events, limits, occupancy, keepalive. Every call must return a
// status (never crash or hang). User events are set before every call that may wait for the
// device (a free, a write from host memory, a read, a sync, a limit, a module load or unload),
// as a session's receive thread would set them meanwhile; only calls that just enqueue run
// while they hold work back. Each input ends with its user events set and the device
// synchronized (reset when a command left a sticky error), and every handle freed, so the next
// input starts from the same state.
//
// Without libcuda or a GPU the target exits with 77, which ctest reports as skipped; any other
// failure to start the backend, or a test module that was built but cannot be read, aborts.
// Kernels that fault or spin are never named: a fault is a sticky error by design (covered by
// CudaBackendTest.StickyErrorPersists), and a spin is a wait, not a bug. So a sticky error
// here is a finding: the device cannot be reset out of one in this process, and the target
// aborts rather than go on testing nothing (FUZZ_LAST keeps the input).
// The replay fails unless the seeds made at least one launch and one write succeed, so it
// cannot pass without reaching the kernel and the copies.
// FUZZ_DRY=1 runs the decoding against a backend that refuses everything (no GPU needed),
// with FUZZ_TRACE=1 printing what each operation decoded to: for checking seeds.
//
// Input: as opencl_backend_fuzz's (backend_fuzz.h), an opcode byte and the fields it reads.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "backend_fuzz.h"
#include "session_fuzz.h"
#include "tandem/server/backend.h"

namespace tandem::test {
namespace {

using server::Backend;

constexpr uint64_t kBase = ir::kCudaVaBase;
constexpr uint64_t kRange = 1ull << 30;  // the reserved range: 1 GiB at the client's base
constexpr int kSkip = 77;                // ctest's SKIP_RETURN_CODE

// A backend that refuses every command (FUZZ_DRY): the decoding alone.
class RefusingBackend final : public Backend {
 public:
  std::string name() const override { return "refusing"; }
  uint32_t device_count() const override { return 1; }
};

struct Env {
  std::unique_ptr<Backend> backend;
  BoundedBulk bulk;
  ir::bytes fatbin;          // the test kernels (tests/cuda_backend/kernels.cu), if built
  uint64_t granularity = 2u << 20;  // of device 0's mappings
  uint64_t launches_ok = 0, writes_ok = 0;  // for the replay's verdict
  const bool dry = std::getenv("FUZZ_DRY") != nullptr;  // RefusingBackend
};

Env* TheEnv() {
  static Env* env = [] {
    auto* e = new Env;
#ifdef TANDEM_TEST_FATBIN
    std::ifstream in(TANDEM_TEST_FATBIN, std::ios::binary);
    e->fatbin.assign(std::istreambuf_iterator<char>(in), {});
    if (e->fatbin.empty()) {
      std::fprintf(stderr, "cuda_backend_fuzz: cannot read the test module %s\n", TANDEM_TEST_FATBIN);
      std::abort();
    }
#else
    std::fprintf(stderr, "cuda_backend_fuzz: built without nvcc: modules and launches are not fuzzed\n");
#endif
    if (e->dry) {
      e->backend = std::make_unique<RefusingBackend>();
      return e;
    }
    auto b = server::MakeCudaBackend(server::BackendOptions{.devices = "0"});
    if (!b.ok()) {
      // No libcuda, no usable driver or no device: nothing to fuzz here. Anything else is a
      // backend that should have started.
      std::fprintf(stderr, "cuda_backend_fuzz: no CUDA backend: %s\n", b.status().ToString().c_str());
      if (b.status().code() == Code::kUnimplemented) std::exit(kSkip);
      std::abort();
    }
    e->backend = std::move(b.value());
    e->backend->set_bulk(&e->bulk);
    ir::AddressReserveRep r;
    Status st = e->backend->OnAddressReserve({0, kBase, kRange}, &r);
    if (!st.ok()) {
      std::fprintf(stderr, "cuda_backend_fuzz: reserving the address range: %s\n", st.ToString().c_str());
      std::abort();
    }
    e->granularity = r.granularity;
    return e;
  }();
  return env;
}

// An address for a command: mostly inside the reserved range near its granules, sometimes just
// outside it, unaligned, or anywhere.
uint64_t Address(Reader& in, uint64_t g) {
  switch (in.u8() & 3) {
    case 0: return kBase + (in.u8() % 16) * g;
    case 1: return kBase + (in.u8() % 16) * g + in.raw(2);
    case 2: return kBase + kRange - g + in.u8() * 4096;
    default: return in.raw(8);
  }
}

// A function name: the one safe real kernel (bump(int), which adds to a module global), one
// that does not exist, empty, or arbitrary bytes.
std::string FunctionName(Reader& in) {
  switch (in.u8() & 3) {
    case 0: return "bump";
    case 1: return "no_such_kernel";
    case 2: return "";
    default: {
      std::string s(in.u8() % 12, '\0');
      for (char& c : s) c = static_cast<char>(in.u8());
      return s;
    }
  }
}

ir::u64s Shape(Reader& in) {
  ir::u64s v;
  for (int n = in.u8() % 5; n > 0; --n) v.push_back((in.u8() & 3) ? 1 + in.u8() % 4 : in.size());
  return v;
}

}  // namespace
}  // namespace tandem::test

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  using namespace tandem::test;
  Env* env = TheEnv();
  Backend& b = *env->backend;
  const uint64_t g = env->granularity;
  Reader in(data, size);
  // FUZZ_TRACE=1: each command and its outcome on stderr (to find what an input hangs or dies in).
  static const bool trace = std::getenv("FUZZ_TRACE") != nullptr;
  auto note = [&](const char* what, const Status& st) {
    if (trace) std::fprintf(stderr, "  %s: %s\n", what, st.ToString().c_str());
  };
  UserEvents user_events(b);
  for (int ops = 0; in.more() && ops < 64; ++ops) {
    const int op = in.u8() % 24;
    if (trace) std::fprintf(stderr, "op %d: case %d\n", ops, op);
    switch (op) {
      case 0: {
        ir::BufferAllocRep r;
        note("OnBufferAlloc", b.OnBufferAlloc({in.buffer(), in.pick(3), in.size(), in.pick(8), Address(in, g)}, &r));
        break;
      }
      case 1: {
        user_events.SetAll();  // a free waits for the device, as cudaFree does
        ir::BufferFreeRep r;
        note("OnBufferFree", b.OnBufferFree({in.buffer()}, &r));
        break;
      }
      case 2: {
        // By handle and offset, or by absolute address (buffer 0).
        const uint64_t buffer = (in.u8() & 1) ? in.buffer() : 0;
        ir::BufferWriteReq q{in.stream(), buffer, buffer ? in.size() : Address(in, g), in.size(), in.data(255),
                             in.region(), in.wait(), in.signal()};
        user_events.SetAll();  // a write from host memory may wait for its stream
        if (trace)
          std::fprintf(stderr, "  write: stream %llu buffer %llu offset 0x%llx size %llu, %zu inline bytes, key %llu\n",
                       (unsigned long long)q.stream, (unsigned long long)q.buffer, (unsigned long long)q.offset,
                       (unsigned long long)q.size, q.data.size(), (unsigned long long)q.remote.key);
        ir::BufferWriteRep r;
        const Status st = b.OnBufferWrite(q, &r);
        env->writes_ok += st.ok();
        note("OnBufferWrite", st);
        break;
      }
      case 3: {
        const uint64_t buffer = (in.u8() & 1) ? in.buffer() : 0;
        ir::BufferReadReq q{in.stream(), buffer, buffer ? in.size() : Address(in, g), in.size(), in.region(),
                            in.wait(), in.signal()};
        // An inline read's reply is bounded by the session before the backend sees it.
        if (q.remote.key == 0 && q.size > (1u << 20)) q.size &= 0xffff;
        user_events.SetAll();
        ir::BufferReadRep r;
        note("OnBufferRead", b.OnBufferRead(q, &r));
        break;
      }
      case 4: {
        const uint64_t src = (in.u8() & 1) ? in.buffer() : 0, dst = (in.u8() & 1) ? in.buffer() : 0;
        ir::BufferCopyRep r;
        note("OnBufferCopy", b.OnBufferCopy({in.stream(), src, src ? in.size() : Address(in, g), dst, dst ? in.size() : Address(in, g),
                        in.size(), in.wait(), in.signal()},
                       &r));
        break;
      }
      case 5: {
        const uint64_t buffer = (in.u8() & 1) ? in.buffer() : 0;
        ir::BufferFillRep r;
        note("OnBufferFill", b.OnBufferFill({in.stream(), buffer, buffer ? in.size() : Address(in, g), in.size(), in.data(8), in.wait(),
                        in.signal()},
                       &r));
        break;
      }
      case 6: {
        ir::BufferCopyRectReq q{in.stream(), in.pick(8), in.pick(8), {}, {}, {}, {}, in.wait(), in.signal()};
        for (auto* v : {&q.src_origin, &q.dst_origin, &q.region})
          for (int n = in.u8() % 5; n > 0; --n) v->push_back(in.size());
        for (int n = in.u8() % 6; n > 0; --n) q.pitches.push_back(in.size());
        ir::BufferCopyRectRep r;
        note("OnBufferCopyRect", b.OnBufferCopyRect(q, &r));
        break;
      }
      case 7: {
        ir::EventCreateRep r;
        const uint64_t ev = in.event();
        const uint32_t flags = in.pick(8);
        if (b.OnEventCreate({ev, in.pick(2), flags}, &r).ok() && (flags & ir::kEventUser)) user_events.Created(ev);
        break;
      }
      case 8: {
        ir::UserEventSetRep r;
        note("OnUserEventSet", b.OnUserEventSet({in.event(), static_cast<int32_t>(in.u8() % 2 ? 0 : -1 - in.u8())}, &r));
        break;
      }
      case 9: {
        ir::EventQueryRep r;
        note("OnEventQuery", b.OnEventQuery({in.event()}, &r));
        break;
      }
      case 10: {
        // A user event destroyed unset leaves what waits on it waiting: set first (as natively,
        // the session's worker ends with its client anyway).
        const uint64_t ev = in.event();
        user_events.SetIfHeld(ev);
        ir::EventDestroyRep r;
        note("OnEventDestroy", b.OnEventDestroy({ev}, &r));
        break;
      }
      case 11: {
        ir::StreamCreateRep r;
        note("OnStreamCreate", b.OnStreamCreate({1u + in.pick(4), in.pick(2), in.pick(4), static_cast<int32_t>(in.u8()) - 128}, &r));
        break;
      }
      case 12: {
        ir::StreamDestroyRep r;
        note("OnStreamDestroy", b.OnStreamDestroy({in.stream()}, &r));
        break;
      }
      case 13: {
        ir::MarkerRep r;
        note("OnMarker", b.OnMarker({in.stream(), in.pick(2), in.wait(), in.signal()}, &r));
        break;
      }
      case 14: {
        user_events.SetAll();
        if (in.u8() & 1) {
          ir::StreamSyncRep r;
          note("OnStreamSync", b.OnStreamSync({in.stream()}, &r));
        } else {
          ir::EventWaitRep r;
          note("OnEventWait", b.OnEventWait({in.wait()}, &r));
        }
        break;
      }
      case 15: {
        user_events.SetAll();
        ir::EventElapsedRep r;
        note("OnEventElapsed", b.OnEventElapsed({in.event(), in.event()}, &r));
        break;
      }
      case 16: {
        user_events.SetAll();
        // The test kernels whole, cut short, or arbitrary bytes; or a kind that is not CUDA's.
        ir::ModuleLoadReq q{1u + in.pick(3), in.pick(2), in.pick(4) == 0 ? 7u : static_cast<uint32_t>(ir::ModuleKind::kCudaImage), {}};
        switch (in.u8() % 3) {
          case 0: q.image = env->fatbin; break;
          case 1: q.image.assign(env->fatbin.begin(), env->fatbin.begin() + std::min<size_t>(env->fatbin.size(), in.raw(2))); break;
          default: q.image = in.data(255);
        }
        ir::ModuleLoadRep r;
        note("OnModuleLoad", b.OnModuleLoad(q, &r));
        break;
      }
      case 17: {
        ir::FunctionGetRep r;
        note("OnFunctionGet", b.OnFunctionGet({1u + in.pick(3), 1u + in.pick(3), FunctionName(in)}, &r));
        break;
      }
      case 18: {
        // bump(int) with arguments of any count, kind and size, in any shape.
        ir::LaunchReq q{.stream = in.stream(), .function = 1u + in.pick(3), .dims = in.pick(5)};
        q.grid = Shape(in);
        q.block = Shape(in);
        if (in.u8() & 1) q.offset = Shape(in);
        q.shared_bytes = (in.u8() & 3) ? 0 : static_cast<uint32_t>(in.size());
        for (int n = in.u8() % 4; n > 0; --n)
          q.args.push_back(ir::LaunchArg{.kind = in.pick(4), .value = (in.u8() & 1) ? in.buffer() : in.raw(8), .data = in.data(16)});
        q.wait = in.wait();
        q.signal = in.signal();
        q.flags = in.pick(4);
        if (trace)
          std::fprintf(stderr, "  launch: function %llu dims %u grid %zu block %zu offset %zu, %zu args (first: kind %u, %zu bytes)\n",
                       (unsigned long long)q.function, q.dims, q.grid.size(), q.block.size(), q.offset.size(),
                       q.args.size(), q.args.empty() ? 0u : q.args[0].kind, q.args.empty() ? size_t{0} : q.args[0].data.size());
        ir::LaunchRep r;
        const Status st = b.OnLaunch(q, &r);
        env->launches_ok += st.ok();
        note("OnLaunch", st);
        break;
      }
      case 19: {
        ir::OccupancyRep r;
        note("OnOccupancy", b.OnOccupancy({1u + in.pick(3), static_cast<uint32_t>(in.size()), in.size()}, &r));
        break;
      }
      case 20: {
        user_events.SetAll();  // setting some limits waits for the context
        // Limits: a CUlimit (and beyond) with any value, then read back.
        const uint32_t limit = in.pick(10);
        ir::DeviceSetLimitRep r;
        note("OnDeviceSetLimit", b.OnDeviceSetLimit({in.pick(2), limit, in.size()}, &r));
        ir::DeviceGetLimitRep got;
        note("OnDeviceGetLimit", b.OnDeviceGetLimit({in.pick(2), limit}, &got));
        break;
      }
      case 21: {
        user_events.SetAll();
        ir::WarmRep r;
        note("OnWarm", b.OnWarm({in.pick(2), in.pick(8), 0, in.data(128)}, &r));
        break;
      }
      case 22: {
        user_events.SetAll();
        const uint64_t buffer = (in.u8() & 1) ? in.buffer() : 0;
        ir::BufferDigestRep r;
        note("OnBufferDigest", b.OnBufferDigest({in.stream(), buffer, buffer ? in.size() : Address(in, g), in.size(), in.size(), in.wait(),
                          in.signal()},
                         &r));
        break;
      }
      default: {
        user_events.SetAll();  // unloading a module waits for its kernels
        ir::MemInfoRep m;
        note("OnMemInfo", b.OnMemInfo({in.pick(2)}, &m));
        ir::PriorityRangeRep p;
        note("OnPriorityRange", b.OnPriorityRange({in.pick(2)}, &p));
        ir::FunctionFreeRep f;
        note("OnFunctionFree", b.OnFunctionFree({1u + in.pick(3)}, &f));
        ir::ModuleFreeRep mf;
        note("OnModuleFree", b.OnModuleFree({1u + in.pick(3)}, &mf));
        break;
      }
    }
  }
  // Nothing may be left waiting or held: user events set, the device drained (and reset when
  // something left a sticky error, so the next input finds it usable), every handle freed.
  if (trace) std::fprintf(stderr, "cleanup\n");
  user_events.SetAll();
  ir::DeviceSyncRep sync;
  if (!env->dry && !b.OnDeviceSync({0}, &sync).ok()) {
    ir::DeviceResetRep reset;
    Status st = b.OnDeviceReset({0}, &reset);
    if (!st.ok()) {
      // A sticky error: every later input would test nothing.
      std::fprintf(stderr, "cuda_backend_fuzz: the device cannot be reset (a sticky error?): %s\n", st.ToString().c_str());
      std::abort();
    }
  }
  FreePools(b);
  for (uint64_t h = 1; h <= 3; ++h) {
    ir::FunctionFreeRep f;
    note("OnFunctionFree", b.OnFunctionFree({h}, &f));
    ir::ModuleFreeRep m;
    note("OnModuleFree", b.OnModuleFree({h}, &m));
  }
  return 0;
}

namespace tandem::test {

namespace {

// Writes a seed field by field, each as Reader (backend_fuzz.h) and the operations above read
// it back, so that the seeds decode to what they say.
class SeedWriter {
 public:
  SeedWriter& op(int n) { return u8(n); }
  SeedWriter& u8(int v) {
    out_.push_back(static_cast<uint8_t>(v));
    return *this;
  }
  SeedWriter& raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) u8(static_cast<int>((v >> (8 * i)) & 0xff));
    return *this;
  }
  SeedWriter& small(int v) { return u8(0).u8(v); }  // size(): a value below 256
  SeedWriter& page() { return u8(1).u8(16); }       // size(): 4096
  SeedWriter& huge() { return u8(3).u8(0); }        // size(): 2^64 - 1
  SeedWriter& buffer(int h) { return u8(h - 1); }
  SeedWriter& stream(int s) { return u8(s); }
  SeedWriter& event(int e) { return u8(e - 100); }
  SeedWriter& no_wait() { return u8(0); }
  SeedWriter& no_signal() { return u8(0); }
  SeedWriter& no_region() { return u8(1); }
  SeedWriter& data(std::initializer_list<int> bytes) {
    u8(static_cast<int>(bytes.size()));
    for (int b : bytes) u8(b);
    return *this;
  }
  SeedWriter& granule(int n) { return u8(0).u8(n); }  // Address(): the reserved range's n-th granule
  SeedWriter& by_handle(int h) { return u8(1).buffer(h); }
  SeedWriter& by_address() { return u8(0); }
  SeedWriter& shape1() { return u8(1).u8(1).u8(0); }  // Shape(): one value, 1
  std::vector<uint8_t> done() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

// A launch of function 1 on the default stream: dims, one-value grid and block, no offset,
// no dynamic shared memory, then `args` arguments of raw bytes of `size` each.
SeedWriter& Launch(SeedWriter& w, int dims, int args, int size) {
  w.op(18).stream(0).u8(0).u8(dims).shape1().shape1().u8(0).u8(1).u8(args);
  for (int i = 0; i < args; ++i) {
    w.u8(0).u8(0).raw(0, 8).u8(size);  // kind bytes; value raw(8); data
    for (int j = 0; j < size; ++j) w.u8(j == 0 ? 1 : 0);
  }
  return w.no_wait().no_signal().u8(0);  // flags
}

}  // namespace

// Seeds: the common shapes in range, then past the ends.
std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  std::vector<std::vector<uint8_t>> seeds;
  {
    // Buffers 1 (4 KiB, granule 0) and 2 (200 B, granule 1); a write, fill, copy and read by
    // handle; a write by absolute address; a digest.
    SeedWriter w;
    w.op(0).buffer(1).u8(0).page().u8(0).granule(0);
    w.op(0).buffer(2).u8(0).small(200).u8(0).granule(1);
    w.op(2).by_handle(1).stream(0).small(0).small(8).data({1, 2, 3, 4, 5, 6, 7, 8}).no_region().no_wait().no_signal();
    w.op(5).by_handle(2).stream(0).small(0).small(32).data({0xab, 0xcd, 0xab, 0xcd}).no_wait().no_signal();
    w.op(4).u8(1).buffer(1).u8(1).buffer(2).stream(0).small(0).small(0).small(64).no_wait().no_signal();
    w.op(3).by_handle(2).stream(0).small(0).small(64).no_region().no_wait().no_signal();
    w.op(2).by_address().stream(0).granule(0).small(4).data({9, 9, 9, 9}).no_region().no_wait().no_signal();
    w.op(22).by_handle(1).stream(0).small(0).small(128).small(0).no_wait().no_signal();
    seeds.push_back(w.done());
  }
  {
    // The test module, bump(int) found and launched right, then with a short argument, with
    // two dimensions' worth of one, and with no argument; occupancy; a limit; a sync.
    SeedWriter w;
    w.op(16).u8(0).u8(0).u8(1).u8(0);  // module 1, device 0, a CUDA image: the fatbinary
    w.op(17).u8(0).u8(0).u8(0);         // function 1 = "bump" of module 1
    Launch(w, 1, 1, 4);
    Launch(w, 1, 1, 2);
    Launch(w, 2, 1, 4);
    Launch(w, 1, 0, 0);
    w.op(19).u8(0).small(32).small(0);
    w.op(20).u8(0).u8(0).small(0).u8(0);  // limit 0 (stack size) to 0, read back
    w.op(14).u8(1).stream(0);             // stream sync
    seeds.push_back(w.done());
  }
  {
    // Sizes and offsets near 2^64, by handle and by address; a user event held by a marker,
    // a failed set, queries.
    SeedWriter w;
    w.op(0).buffer(3).u8(0).huge().u8(0).granule(2);
    w.op(2).by_handle(1).stream(0).huge().huge().data({1}).no_region().no_wait().no_signal();
    w.op(4).u8(0).u8(0).stream(0).u8(3).raw(~uint64_t{0}, 8).u8(3).raw(~uint64_t{0} - 7, 8).huge().no_wait().no_signal();
    w.op(7).event(101).u8(0).u8(1);       // event 101, device 0, a user event
    w.op(13).stream(0).u8(0).u8(1).event(101).no_signal();  // a marker waiting on it
    w.op(8).event(101).u8(0).u8(5);       // set to a failure (-6)
    w.op(9).event(101).op(15).event(101).event(102);
    seeds.push_back(w.done());
  }
  return seeds;
}

// The replay's verdict (replay_main): the seeds must have reached the kernel and the copies.
int ReplayVerdict() {
  const Env* env = TheEnv();
  if (env->dry || env->fatbin.empty()) return 0;
  if (env->launches_ok == 0 || env->writes_ok == 0) {
    std::fprintf(stderr, "cuda_backend_fuzz: the inputs made %llu launches and %llu writes succeed: the seeds no longer reach them\n",
                 static_cast<unsigned long long>(env->launches_ok), static_cast<unsigned long long>(env->writes_ok));
    return 1;
  }
  ReplaySummary();
  return 0;
}

// On stderr: the backend captures fd 1 for device printf.
void ReplaySummary() {
  const Env* env = TheEnv();
  if (env->dry) {
    std::fprintf(stderr, "dry run (FUZZ_DRY): nothing reached a backend\n");
    return;
  }
  std::fprintf(stderr, "%llu launches and %llu writes succeeded\n", static_cast<unsigned long long>(env->launches_ok),
               static_cast<unsigned long long>(env->writes_ok));
}

}  // namespace tandem::test
