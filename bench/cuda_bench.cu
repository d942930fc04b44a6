// cuda_bench: an ordinary CUDA program (nvcc -cudart shared, nothing Tandem-specific) that
// measures the costs Tandem adds. run_bench.sh runs it natively and through `tandem run`
// and compares. Output: one line per measurement, `name value unit`, fixed names, or
// `name n/a reason` for one that cannot be taken here; notes go to stderr.
// TANDEM_BENCH_QUICK=1: few repetitions, sizes up to 1 MiB (a smoke run).
//   cuda_bench          launch, copy latency, bandwidth, idle read-back
//   cuda_bench --idle   only the warm and idle read-backs (run again with keepalive off)
//   cuda_bench --no-idle  everything but the idle read-backs
//   cuda_bench --idle-busy  the same, the program's thread busy-waiting through each gap
//                       instead of sleeping: what is left of the idle cost then is the
//                       link's and the GPU's, not the program's CPU going idle
//   cuda_bench --idle-keepalive  the same, with a keepalive inside the program: a thread of
//                       its own that, every TANDEM_KEEPALIVE_MS (default 2), copies 8 B to
//                       the device and back and launches an empty kernel on a stream of its
//                       own, as tandemd's does (natively only: what a keepalive can do with
//                       no network in the path)
//   cuda_bench --s2s    only device 0 -> device 1 copies: cudaMemcpyPeer against a relay
//                       through pinned host memory (needs two devices, else n/a rows)
// Every CUDA call of the first two modes is checked and any error exits 1; in --s2s mode
// an error becomes an n/a row with its reason, since multi-device support is what is tested.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

#define CK(call)                                                                            \
  do {                                                                                      \
    cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "cuda_bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,       \
                   cudaGetErrorString(err_));                                               \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

__global__ void empty_kernel() {}

namespace {

bool quick = false;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void Print(const char* name, double value, const char* unit) {
  std::printf("%s %.4f %s\n", name, value, unit);
  std::fflush(stdout);
}

int Reps(int full, int q) { return quick ? q : full; }

void Launch() {
  empty_kernel<<<1, 1>>>();
  CK(cudaGetLastError());
}

// N launches then one synchronize, divided by N; median over repetitions.
void LaunchAsync() {
  const int n = Reps(1000, 20);
  std::vector<double> per;
  for (int r = 0; r < Reps(30, 3); ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) Launch();
    CK(cudaDeviceSynchronize());
    per.push_back(Us(t0, Clock::now()) / n);
  }
  Print("cuda_launch_async", Median(per), "us");
}

void LaunchSync() {
  std::vector<double> t;
  for (int r = 0; r < Reps(2000, 20); ++r) {
    auto t0 = Clock::now();
    Launch();
    CK(cudaDeviceSynchronize());
    t.push_back(Us(t0, Clock::now()));
  }
  Print("cuda_launch_sync", Median(t), "us");
}

void CopyLatency(void* dev, const char* label, size_t bytes) {
  std::vector<char> host(bytes, 1);
  for (bool h2d : {true, false}) {
    std::vector<double> t;
    for (int r = 0; r < Reps(2000, 20); ++r) {
      auto t0 = Clock::now();
      if (h2d) CK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
      else CK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
      t.push_back(Us(t0, Clock::now()));
    }
    char name[64];
    std::snprintf(name, sizeof name, "cuda_memcpy_%s_%s", h2d ? "h2d" : "d2h", label);
    Print(name, Median(t), "us");
  }
}

void Bandwidth(void* dev, bool pinned, const char* label, size_t bytes, int reps) {
  char* host = nullptr;
  std::vector<char> pageable;
  if (pinned) {
    CK(cudaMallocHost(&host, bytes));
    std::memset(host, 1, bytes);
  } else {
    pageable.assign(bytes, 1);
    host = pageable.data();
  }
  for (bool h2d : {true, false}) {
    // One unmeasured copy first: page faults, pinning and first-touch costs.
    if (h2d) CK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    else CK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    std::vector<double> gbs;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      if (h2d) CK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
      else CK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
      gbs.push_back(bytes / (Us(t0, Clock::now()) * 1e3));
    }
    char name[64];
    std::snprintf(name, sizeof name, "cuda_bw_%s_%s_%s", h2d ? "h2d" : "d2h", pinned ? "pinned" : "pageable", label);
    Print(name, Median(gbs), "GB/s");
  }
  if (pinned) CK(cudaFreeHost(host));
}

// A small read back after the link has been idle for a while (the thread sleeping through
// the gap, or busy-waiting with busy_gap).
bool busy_gap = false;

void IdleReadback(void* dev) {
  int v = 0;
  std::vector<double> warm;
  for (int r = 0; r < Reps(500, 10); ++r) {
    auto t0 = Clock::now();
    CK(cudaMemcpy(&v, dev, sizeof v, cudaMemcpyDeviceToHost));
    warm.push_back(Us(t0, Clock::now()));
  }
  Print("cuda_readback_warm", Median(warm), "us");
  // p50 over 20-50 samples a gap (about 4 s in all); 3 in quick mode.
  struct Gap { double ms; const char* label; int reps; };
  for (Gap g : {Gap{0.1, "0.1ms", 50}, Gap{1, "1ms", 50}, Gap{5, "5ms", 40}, Gap{20, "20ms", 30}, Gap{100, "100ms", 20}}) {
    std::vector<double> t;
    for (int r = 0; r < Reps(g.reps, 3); ++r) {
      const auto gap = std::chrono::duration<double, std::milli>(g.ms);
      if (busy_gap) {
        for (auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(gap); Clock::now() < until;) {
        }
      } else {
        std::this_thread::sleep_for(gap);
      }
      auto t0 = Clock::now();
      CK(cudaMemcpy(&v, dev, sizeof v, cudaMemcpyDeviceToHost));
      t.push_back(Us(t0, Clock::now()));
    }
    char name[64];
    std::snprintf(name, sizeof name, "cuda_readback_idle_%s", g.label);
    Print(name, Median(t), "us");
  }
}

// --idle-keepalive: tandemd's keepalive (server/backends/cuda/cuda_warm.cc), in the program.
class InProcessKeepalive {
 public:
  InProcessKeepalive() {
    double ms = 2;
    if (const char* v = std::getenv("TANDEM_KEEPALIVE_MS"); v && *v) ms = std::atof(v);
    period_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CK(cudaMalloc(&scratch_, 64));
    thread_ = std::thread([this] { Loop(); });
  }
  ~InProcessKeepalive() {
    stop_ = true;
    thread_.join();
    CK(cudaFree(scratch_));
    CK(cudaStreamDestroy(stream_));
  }
  uint64_t rounds() const { return rounds_; }

 private:
  void Loop() {
    char host[8] = {0x5a};
    while (!stop_) {
      std::this_thread::sleep_for(period_);
      CK(cudaMemcpyAsync(scratch_, host, sizeof host, cudaMemcpyHostToDevice, stream_));
      empty_kernel<<<1, 1, 0, stream_>>>();
      CK(cudaGetLastError());
      CK(cudaMemcpyAsync(host, scratch_, sizeof host, cudaMemcpyDeviceToHost, stream_));
      CK(cudaStreamSynchronize(stream_));
      ++rounds_;
    }
  }
  Clock::duration period_{};
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0};
  std::thread thread_;
};

// An error in --s2s mode: the reason for the n/a rows.
std::string Why(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err);
}
#define SOFT(call)                                                 \
  do {                                                             \
    cudaError_t err_ = (call);                                     \
    if (err_ != cudaSuccess) return Why(#call, err_);              \
  } while (0)

// Device 0 -> device 1: cudaMemcpyPeer (through Tandem a server-to-server copy) against the
// same bytes relayed through pinned host memory (D2H from device 0, then H2D to device 1).
// Returns "" or why the rest could not be measured; `done` counts the rows printed.
std::string PeerCopy(size_t bytes, const char* label, int reps, int* done) {
  char s2s[64], relay[64];
  std::snprintf(s2s, sizeof s2s, "cuda_s2s_copy_%s", label);
  std::snprintf(relay, sizeof relay, "cuda_relay_copy_%s", label);
  void *src = nullptr, *dst = nullptr;
  char* host = nullptr;
  SOFT(cudaSetDevice(0));
  SOFT(cudaMalloc(&src, bytes));
  SOFT(cudaMemset(src, 0x5a, bytes));
  SOFT(cudaSetDevice(1));
  SOFT(cudaMalloc(&dst, bytes));
  SOFT(cudaMemset(dst, 0, bytes));
  SOFT(cudaDeviceSynchronize());
  // Peer access may be refused (different servers, no P2P); the copy must work anyway.
  (void)cudaDeviceEnablePeerAccess(0, 0);
  SOFT(cudaSetDevice(0));
  (void)cudaDeviceEnablePeerAccess(1, 0);
  (void)cudaGetLastError();
  auto sync_both = [&]() -> cudaError_t {
    cudaError_t e = cudaSetDevice(1);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e;
  };
  std::vector<double> gbs;
  for (int r = 0; r <= reps; ++r) {  // the first is unmeasured
    auto t0 = Clock::now();
    SOFT(cudaMemcpyPeer(dst, 1, src, 0, bytes));
    SOFT(sync_both());
    if (r > 0) gbs.push_back(bytes / (Us(t0, Clock::now()) * 1e3));
  }
  // The copy must have happened: the first and last bytes of the destination.
  unsigned char probe[2] = {0, 0};
  SOFT(cudaSetDevice(1));
  SOFT(cudaMemcpy(&probe[0], dst, 1, cudaMemcpyDeviceToHost));
  SOFT(cudaMemcpy(&probe[1], static_cast<char*>(dst) + bytes - 1, 1, cudaMemcpyDeviceToHost));
  if (probe[0] != 0x5a || probe[1] != 0x5a) return "cudaMemcpyPeer: wrong data on device 1";
  Print(s2s, Median(gbs), "GB/s");
  ++*done;

  SOFT(cudaMallocHost(&host, bytes));
  gbs.clear();
  for (int r = 0; r <= reps; ++r) {
    auto t0 = Clock::now();
    SOFT(cudaSetDevice(0));
    SOFT(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
    SOFT(cudaSetDevice(1));
    SOFT(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
    if (r > 0) gbs.push_back(bytes / (Us(t0, Clock::now()) * 1e3));
  }
  Print(relay, Median(gbs), "GB/s");
  ++*done;
  SOFT(cudaFreeHost(host));
  SOFT(cudaFree(dst));
  SOFT(cudaSetDevice(0));
  SOFT(cudaFree(src));
  return "";
}

int PeerMain() {
  const size_t bytes = quick ? (1u << 20) : (256u << 20);
  const char* label = quick ? "1MiB" : "256MiB";
  int count = 0, done = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  std::string why;
  if (err != cudaSuccess) why = Why("cudaGetDeviceCount", err);
  else if (count < 2) why = std::to_string(count) + " device(s)";
  else why = PeerCopy(bytes, label, Reps(5, 3), &done);
  if (!why.empty()) {
    std::fprintf(stderr, "cuda_bench --s2s: %s\n", why.c_str());
    if (done < 1) std::printf("cuda_s2s_copy_%s n/a %s\n", label, why.c_str());
    if (done < 2) std::printf("cuda_relay_copy_%s n/a %s\n", label, why.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* q = std::getenv("TANDEM_BENCH_QUICK");
  quick = q && *q && std::strcmp(q, "0") != 0;
  std::string mode = argc > 1 ? argv[1] : "";
  bool keepalive = false;
  if (mode == "--idle-busy") {
    busy_gap = true;
    mode = "--idle";
  } else if (mode == "--idle-keepalive") {
    keepalive = true;
    mode = "--idle";
  }
  if (mode != "" && mode != "--idle" && mode != "--no-idle" && mode != "--s2s") {
    std::fprintf(stderr, "usage: cuda_bench [--idle | --idle-busy | --idle-keepalive | --no-idle | --s2s]\n");
    return 2;
  }
  if (mode == "--s2s") return PeerMain();
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 1) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "cuda_bench: device 0: %s%s\n", prop.name, quick ? " (quick mode)" : "");
  CK(cudaSetDevice(0));

  const size_t max_bytes = mode == "--idle" ? 4096 : quick ? (1u << 20) : (256u << 20);
  void* dev = nullptr;
  CK(cudaMalloc(&dev, max_bytes));
  CK(cudaMemset(dev, 0, max_bytes));
  // Warm-up: context, module load, first launches and copies.
  for (int i = 0; i < 100; ++i) Launch();
  CK(cudaDeviceSynchronize());

  if (mode != "--idle") {
    LaunchAsync();
    LaunchSync();
    CopyLatency(dev, "8B", 8);
    CopyLatency(dev, "4KB", 4096);
    struct Size { size_t bytes; const char* label; int reps; };
    for (bool pinned : {false, true})
      for (Size s : {Size{1u << 20, "1MiB", 100}, Size{64u << 20, "64MiB", 10}, Size{256u << 20, "256MiB", 5}}) {
        if (s.bytes > max_bytes) continue;
        Bandwidth(dev, pinned, s.label, s.bytes, Reps(s.reps, 3));
      }
  }
  if (keepalive) {
    InProcessKeepalive k;
    IdleReadback(dev);
    std::fprintf(stderr, "cuda_bench: %llu in-process keepalive rounds\n", static_cast<unsigned long long>(k.rounds()));
  } else if (mode != "--no-idle") {
    IdleReadback(dev);
  }

  CK(cudaFree(dev));
  CK(cudaDeviceSynchronize());
  return 0;
}
