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
// Without a GPU (or libcuda) the target exits with 77, which ctest reports as skipped.
// Kernels that fault or spin are never named: a fault is a sticky error by design (covered by
// CudaBackendTest.StickyErrorPersists), and a spin is a wait, not a bug.
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

struct Env {
  std::unique_ptr<Backend> backend;
  BoundedBulk bulk;
  ir::bytes fatbin;          // the test kernels (tests/cuda_backend/kernels.cu), if built
  uint64_t granularity = 0;  // of device 0's mappings
};

Env* TheEnv() {
  static Env* env = [] {
    auto* e = new Env;
    auto b = server::MakeCudaBackend(server::BackendOptions{.devices = "0"});
    if (!b.ok()) {
      std::fprintf(stderr, "cuda_backend_fuzz: no CUDA backend (skipped): %s\n", b.status().ToString().c_str());
      std::exit(kSkip);
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
#ifdef TANDEM_TEST_FATBIN
    std::ifstream in(TANDEM_TEST_FATBIN, std::ios::binary);
    e->fatbin.assign(std::istreambuf_iterator<char>(in), {});
#endif
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
        ir::BufferWriteRep r;
        note("OnBufferWrite", b.OnBufferWrite(q, &r));
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
        ir::LaunchRep r;
        note("OnLaunch", b.OnLaunch(q, &r));
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
  if (!b.OnDeviceSync({0}, &sync).ok()) {
    ir::DeviceResetRep reset;
    Status st = b.OnDeviceReset({0}, &reset);
    if (!st.ok()) std::fprintf(stderr, "cuda_backend_fuzz: device reset: %s\n", st.ToString().c_str());
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

// Seeds: the common shapes in range, then past the ends.
std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  std::vector<std::vector<uint8_t>> seeds;
  // Two allocations at granules 0 and 1; a write, fill, copy and read by handle; the same by
  // absolute address; a digest.
  seeds.push_back({0, 0, 0, 1, 0, 0, 0, 0,            // alloc buffer 1, device 0, ~4 KiB, flags 0, granule 0
                   0, 1, 0, 0, 200, 0, 0, 1,          // alloc buffer 2, 200 B, granule 1
                   2, 1, 0, 0, 0, 8, 0, 16, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 0, 0,
                   5, 1, 1, 0, 0, 0, 32, 2, 0xab, 0xcd, 0, 0,
                   4, 1, 1, 0, 0, 0, 1, 0, 0, 0, 64, 0, 0,
                   3, 1, 0, 0, 0, 0, 64, 1, 0, 0,
                   2, 0, 0, 0, 0, 0, 16, 4, 9, 9, 9, 9, 1, 0, 0,
                   22, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  // The test module, bump found and launched right and wrong, occupancy, limits.
  seeds.push_back({16, 0, 0, 1, 0,                 // load module 1 (the fatbin) on device 0
                   17, 0, 0, 0,                    // function 1 = bump in module 1
                   18, 0, 0, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0, 0, 0,
                   18, 0, 0, 3, 3, 0, 255, 0, 0, 0, 1, 0, 2, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0,
                   19, 0, 0, 0, 0,
                   20, 0, 0, 0, 0, 0,
                   14, 0, 0});
  // User events held by commands, failed sets, queries; sizes and addresses near 2^64.
  seeds.push_back({7, 1, 1, 0, 7, 2, 0, 0, 13, 1, 0, 1, 1, 0, 8, 1, 0, 3, 9, 1, 15, 1, 2,
                   0, 0, 0, 3, 0, 3, 3, 9, 1, 3, 0, 3, 2, 3, 3, 3, 3, 0, 0, 4, 0, 1, 1, 3, 0, 3, 3, 3, 0, 0,
                   6, 0, 1, 2, 3, 3, 3, 3, 3, 3, 2, 3, 4, 3, 5, 4, 3, 9, 3, 9, 3, 9, 3, 9, 0, 0});
  return seeds;
}

}  // namespace tandem::test
