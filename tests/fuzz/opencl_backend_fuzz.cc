// Feeds a session's worth of memory, stream and event commands with arbitrary fields straight
// to the OpenCL backend on the machine's OpenCL (PoCL in CI): sizes, offsets, pitches,
// origins and regions past every end and near 2^64, unknown and freed handles, wait lists of
// failed, unknown and user events, inline data shorter or longer than its size, RMA regions
// past the client's memory. Every call must return (a status, never a crash or a hang), and
// each input ends with its user events set, a device sync and every handle freed, so the
// next input starts from the same state. Programs and launches are left out: each build is
// seconds of PoCL's compiler.
//
// Input: a sequence of operations, each an opcode byte and the fields it reads (u8 handles
// from a pool of 7 buffers, 4 streams and 7 events, so commands meet each other's objects;
// u64 sizes and offsets drawn small, near an object's end or near 2^64 by a selector byte).
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend_fuzz.h"
#include "session_fuzz.h"
#include "tandem/server/backend.h"

namespace tandem::test {
namespace {

using server::Backend;

struct Env {
  std::unique_ptr<Backend> backend;
  BoundedBulk bulk;
};

Env* TheEnv() {
  static Env* env = [] {
    auto* e = new Env;
    // One device: a command waiting on another device's event waits on the host, where only
    // a later command of this one thread could set it.
    auto b = server::MakeOpenCLBackend(server::BackendOptions{.devices = "0"});
    if (!b.ok()) {
      std::fprintf(stderr, "opencl_backend_fuzz: no OpenCL backend: %s\n", b.status().ToString().c_str());
      std::abort();
    }
    e->backend = std::move(b.value());
    e->backend->set_bulk(&e->bulk);
    return e;
  }();
  return env;
}

}  // namespace
}  // namespace tandem::test

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  using namespace tandem::test;
  Env* env = TheEnv();
  Backend& b = *env->backend;
  // OPENCL_FUZZ_LAST=FILE: each input is written there before it runs, so one that makes the
  // OpenCL implementation abort the process (no artifact from libFuzzer then) is kept.
  if (static const char* last = std::getenv("OPENCL_FUZZ_LAST"); last) {
    if (FILE* f = std::fopen(last, "wb")) {
      std::fwrite(data, 1, size, f);
      std::fclose(f);
    }
  }
  Reader in(data, size);
  // Set before a read back, a bulk write, event times or a sync.
  UserEvents user_events(b);
  for (int ops = 0; in.more() && ops < 64; ++ops) {
    switch (in.u8() % 16) {
      case 0: {
        ir::BufferAllocRep r;
        b.OnBufferAlloc({in.buffer(), in.pick(2), in.size(), 0, 0}, &r);
        break;
      }
      case 1: {
        ir::BufferFreeRep r;
        b.OnBufferFree({in.buffer()}, &r);
        break;
      }
      case 2: {
        ir::BufferWriteRep r;
        ir::BufferWriteReq q{in.stream(), in.buffer(), in.size(), in.size(), in.data(255), in.region(), in.wait(), in.signal()};
        if (q.remote.key != 0) user_events.SetAll();
        b.OnBufferWrite(q, &r);
        break;
      }
      case 3: {
        ir::BufferReadRep r;
        ir::BufferReadReq q{in.stream(), in.buffer(), in.size(), in.size(), in.region(), in.wait(), in.signal()};
        if (q.remote.key == 0 && q.size > (1u << 20)) q.size &= 0xffff;  // an inline read's reply is built here
        user_events.SetAll();
        b.OnBufferRead(q, &r);
        break;
      }
      case 4: {
        ir::BufferCopyRep r;
        b.OnBufferCopy({in.stream(), in.buffer(), in.size(), in.buffer(), in.size(), in.size(), in.wait(), in.signal()}, &r);
        break;
      }
      case 5: {
        ir::BufferFillRep r;
        b.OnBufferFill({in.stream(), in.buffer(), in.size(), in.size(), in.data(8), in.wait(), in.signal()}, &r);
        break;
      }
      case 6: {
        ir::BufferCopyRectRep r;
        ir::BufferCopyRectReq q{in.stream(), in.buffer(), in.buffer(), {}, {}, {}, {}, in.wait(), in.signal()};
        for (auto* v : {&q.src_origin, &q.dst_origin, &q.region})
          for (int n = in.u8() % 5; n > 0; --n) v->push_back(in.size());
        for (int n = in.u8() % 6; n > 0; --n) q.pitches.push_back(in.size());
        b.OnBufferCopyRect(q, &r);
        break;
      }
      case 7: {
        ir::EventCreateRep r;
        const uint64_t ev = in.event();
        const uint32_t flags = in.pick(4);
        if (b.OnEventCreate({ev, in.pick(2), flags}, &r).ok() && (flags & ir::kEventUser)) user_events.Created(ev);
        break;
      }
      case 8: {
        ir::UserEventSetRep r;
        b.OnUserEventSet({in.event(), static_cast<int32_t>(in.u8() % 2 ? 0 : -1 - in.u8())}, &r);
        break;
      }
      case 9: {
        ir::EventQueryRep r;
        b.OnEventQuery({in.event()}, &r);
        break;
      }
      case 10: {
        // A user event destroyed unset leaves the commands waiting on it waiting forever, as
        // natively (the session's worker still ends when its client goes: it _exits): set first.
        ir::EventDestroyRep r;
        const uint64_t ev = in.event();
        user_events.SetIfHeld(ev);
        b.OnEventDestroy({ev}, &r);
        break;
      }
      case 11: {
        ir::StreamCreateRep r;
        b.OnStreamCreate({1u + in.pick(4), in.pick(2), in.pick(2), 0}, &r);
        break;
      }
      case 12: {
        ir::StreamDestroyRep r;
        b.OnStreamDestroy({in.stream()}, &r);
        break;
      }
      case 13: {
        ir::MarkerRep r;
        b.OnMarker({in.stream(), in.pick(2), in.wait(), in.signal()}, &r);
        break;
      }
      case 14: {
        ir::EventTimesRep r;
        user_events.SetAll();
        b.OnEventTimes({in.event()}, &r);
        break;
      }
      default: {
        ir::StreamFlushRep r;
        b.OnStreamFlush({in.stream()}, &r);
        break;
      }
    }
  }
  // Nothing may be left waiting: user events set, the device drained, every handle freed.
  user_events.SetAll();
  for (uint64_t d : {0, 1}) {
    ir::DeviceSyncRep r;
    b.OnDeviceSync({d}, &r);
  }
  FreePools(b);
  return 0;
}

namespace tandem::test {

// Seeds: each operation once with fields in range, then the same shapes past the ends.
std::vector<std::vector<uint8_t>> BuiltinSeeds() {
  std::vector<std::vector<uint8_t>> seeds;
  // alloc 1 (256 B) and 2 (~4 KiB); write, fill, copy, rect copy, read; events; a marker.
  seeds.push_back({0, 0, 0, 0, 0,    // alloc buffer 1, device 0, size class 0 (0 bytes? -> u8 next)
                   0, 1, 0, 1, 0,    // alloc buffer 2, size ~4 KiB
                   2, 0, 0, 0, 0, 0, 16, 16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1, 0, 0,
                   5, 0, 1, 0, 8, 0, 32, 2, 0xab, 0xcd, 0, 0,
                   4, 0, 0, 0, 0, 1, 0, 16, 0, 16, 0, 0,
                   7, 0, 2, 0, 13, 0, 0, 0, 1, 0, 9, 0, 14, 0,
                   3, 0, 1, 0, 0, 0, 64, 1, 0, 0});
  // A user event held, commands waiting on it, a failed set, queries, then unknown handles.
  seeds.push_back({7, 1, 1, 0, 0, 0, 0, 64, 2, 0, 0, 0, 0, 0, 8, 4, 1, 2, 3, 4, 1, 1, 1, 1,
                   8, 1, 0, 3, 9, 1, 10, 1, 1, 6, 0, 12, 3, 0, 0, 0, 0, 0, 0});
  // Near 2^64: sizes and offsets wrapping, a rect copy with huge pitches.
  seeds.push_back({0, 0, 0, 3, 0, 2, 0, 0, 3, 1, 3, 2, 4, 1, 1, 1, 3, 0, 0, 3, 7, 3, 9, 0, 0,
                   6, 0, 0, 0, 3, 3, 0, 3, 1, 3, 3, 3, 3, 3, 3, 3, 2, 3, 4, 3, 5, 4, 3, 9, 3, 9, 3, 9, 3, 9, 0, 0});
  return seeds;
}

}  // namespace tandem::test
