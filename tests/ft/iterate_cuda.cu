// The CUDA variant of the fault-tolerance program: a pointer-linked structure in device
// memory (each node holds the device address of the next, in a shuffled order), updated by
// one kernel per round for hundreds of rounds, with a small read back each round and a
// checksum every 25 rounds. Part of the state lives in a __device__ global (set with
// cudaMemcpyToSymbol, advanced by a kernel each round, read with cudaMemcpyFromSymbol every 25
// rounds): a restore must bring module globals back too. Exact integer arithmetic: the same
// bytes on every correct run.
// An ordinary CUDA program (nvcc -cudart shared), nothing Tandem-specific.
// With --bulk-every K, every K-th round also reads all nodes back and writes them again with
// changed values (transfers large enough to go by RMA through Tandem).
//   iterate_cuda [--rounds N] [--n NODES] [--sleep-ms MS] [--bulk-every K]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

struct Node {
  Node* next;
  uint32_t value;
  uint32_t pad;
};

__global__ void Advance(Node* nodes, uint32_t* out, uint32_t n, uint32_t round) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // Follow two links: the values depend on the pointers being right after any restore.
  const Node* a = nodes[i].next;
  const Node* b = a->next;
  uint32_t x = nodes[i].value * 1664525u + (a->value ^ (b->value >> 3)) + round * 2654435761u;
  out[i] = x ^ (x >> 15);
}

constexpr int kMix = 64;
__device__ uint32_t g_mix[kMix];  // state kept in a module global across rounds

__global__ void Mix(const uint32_t* out, uint32_t n, uint32_t round) {
  const uint32_t t = threadIdx.x;
  const uint32_t v = g_mix[t] * 33u + out[(t * 1031u + round * 7u) % n];
  g_mix[t] = v ^ (v >> 13);
}

__global__ void Store(Node* nodes, const uint32_t* in, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) nodes[i].value = in[i];
}

static uint64_t Fnv(const uint32_t* v, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= v[i];
    h *= 1099511628211ull;
  }
  return h;
}

int main(int argc, char** argv) {
  int rounds = 300, sleep_ms = 0, bulk_every = 0;
  uint32_t n = 1 << 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--n")) n = static_cast<uint32_t>(std::atol(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--sleep-ms")) sleep_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bulk-every")) bulk_every = std::atoi(argv[i + 1]);
  }
  if (n < 1024) {
    std::fprintf(stderr, "iterate_cuda: --n must be at least 1024\n");
    return 2;
  }
  Node* nodes = nullptr;
  uint32_t* scratch = nullptr;
  CHECK(cudaMalloc(&nodes, n * sizeof(Node)));
  CHECK(cudaMalloc(&scratch, n * sizeof(uint32_t)));
  // A shuffled cycle through all nodes, linked by device addresses.
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  uint64_t s = 88172645463325252ull;
  for (uint32_t i = n - 1; i > 0; --i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::swap(order[i], order[s % (i + 1)]);
  }
  std::vector<Node> host(n);
  for (uint32_t k = 0; k < n; ++k) {
    host[order[k]].next = nodes + order[(k + 1) % n];
    host[order[k]].value = order[k] * 2654435761u + 12345u;
  }
  CHECK(cudaMemcpy(nodes, host.data(), n * sizeof(Node), cudaMemcpyHostToDevice));
  uint32_t mix[kMix];
  for (int t = 0; t < kMix; ++t) mix[t] = 2166136261u + 16777619u * static_cast<uint32_t>(t);
  CHECK(cudaMemcpyToSymbol(g_mix, mix, sizeof mix));
  const unsigned block = 256, grid = (n + block - 1) / block;
  uint32_t window[256];
  uint64_t running = 0;
  for (int r = 0; r < rounds; ++r) {
    Advance<<<grid, block>>>(nodes, scratch, n, static_cast<uint32_t>(r));
    Mix<<<1, kMix>>>(scratch, n, static_cast<uint32_t>(r));
    Store<<<grid, block>>>(nodes, scratch, n);
    size_t at = (static_cast<size_t>(r) * 997u) % (n - 256);
    CHECK(cudaMemcpy(window, scratch + at, sizeof window, cudaMemcpyDeviceToHost));
    running = running * 31 + Fnv(window, 256);
    if (bulk_every > 0 && (r + 1) % bulk_every == 0) {
      // Every node back (the values only count: the links are device addresses, which
      // differ between runs), then every node again with its value changed.
      CHECK(cudaMemcpy(host.data(), nodes, n * sizeof(Node), cudaMemcpyDeviceToHost));
      std::vector<uint32_t> values(n);
      for (uint32_t i = 0; i < n; ++i) values[i] = host[i].value;
      running = running * 31 + Fnv(values.data(), n);
      for (uint32_t i = 0; i < n; ++i) host[i].value ^= static_cast<uint32_t>(r) * 40503u + i;
      CHECK(cudaMemcpy(nodes, host.data(), n * sizeof(Node), cudaMemcpyHostToDevice));
    }
    if ((r + 1) % 25 == 0) {
      CHECK(cudaMemcpyFromSymbol(mix, g_mix, sizeof mix));
      std::printf("round %d: window %016llx mix %016llx\n", r + 1, static_cast<unsigned long long>(running),
                  static_cast<unsigned long long>(Fnv(mix, kMix)));
    }
    std::fflush(stdout);
    if (sleep_ms) {
      timespec ts{sleep_ms / 1000, static_cast<long>(sleep_ms % 1000) * 1000000L};
      nanosleep(&ts, nullptr);
    }
  }
  std::vector<uint32_t> all(n);
  CHECK(cudaMemcpy(all.data(), scratch, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::printf("final: %016llx\n", static_cast<unsigned long long>(Fnv(all.data(), n)));
  CHECK(cudaFree(nodes));
  CHECK(cudaFree(scratch));
  return 0;
}
