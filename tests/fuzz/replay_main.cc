// The fuzz entry point run over its seeds in every build, so it cannot rot: the built-in
// seeds, then every file of the directories named on the command line (the corpus).
// `--write-seeds DIR` writes the built-in seeds out as a starting corpus for libFuzzer.
// `--random SECONDS [SEED]` fuzzes without libFuzzer (the GPU machine has no clang): for that
// long it runs generated inputs, each a seed mutated a few times (bytes changed, inserted,
// removed, or runs of a seed spliced in) or bytes at random. Each input is written to
// FUZZ_LAST (when set) before it runs, so one that kills the process is kept. An input that
// runs longer than FUZZ_TIMEOUT_S seconds (default 20; also when replaying) is a hang: the
// process says so and exits with 70.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>

#include "session_fuzz.h"

namespace {

using Input = std::vector<uint8_t>;

Input Mutate(const std::vector<Input>& seeds, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  Input in;
  if (seeds.empty() || pick(8) == 0) {
    in.resize(pick(512));
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    return in;
  }
  in = seeds[pick(seeds.size())];
  for (size_t edits = 1 + pick(8); edits > 0; --edits) {
    switch (pick(5)) {
      case 0:
        if (!in.empty()) in[pick(in.size())] = static_cast<uint8_t>(rng());
        break;
      case 1:
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size() + 1)), static_cast<uint8_t>(rng()));
        break;
      case 2:
        if (!in.empty()) in.erase(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size())));
        break;
      case 3:
        // A small value where the readers draw sizes and selectors.
        if (!in.empty()) in[pick(in.size())] = static_cast<uint8_t>(pick(4));
        break;
      default: {
        const Input& other = seeds[pick(seeds.size())];
        if (other.empty()) break;
        const size_t from = pick(other.size()), n = 1 + pick(std::min<size_t>(32, other.size() - from));
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size() + 1)), other.begin() + static_cast<std::ptrdiff_t>(from),
                  other.begin() + static_cast<std::ptrdiff_t>(from + n));
      }
    }
  }
  if (in.size() > 4096) in.resize(4096);
  return in;
}

// Counts inputs; a watchdog thread ends the process when the count stops moving for
// FUZZ_TIMEOUT_S while an input runs.
std::atomic<uint64_t> g_started{0}, g_finished{0};

int Run(const uint8_t* data, size_t size) {
  g_started.fetch_add(1);
  const int r = LLVMFuzzerTestOneInput(data, size);
  g_finished.fetch_add(1);
  return r;
}

void StartWatchdog() {
  const char* v = std::getenv("FUZZ_TIMEOUT_S");
  const int limit = v ? std::atoi(v) : 20;
  if (limit <= 0) return;
  std::thread([limit] {
    uint64_t seen = ~uint64_t{0};
    int still = 0;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const uint64_t now = g_started.load();
      if (now != seen || g_finished.load() == now) {
        seen = now;
        still = 0;
      } else if (++still >= limit) {
        std::fprintf(stderr, "input %llu ran over %d s: a hang\n", static_cast<unsigned long long>(now), limit);
        std::fflush(stderr);
        std::_Exit(70);
      }
    }
  }).detach();
}

}  // namespace

// A target may judge the replay (e.g. that its seeds reached what they are for); 0: passed.
// ReplaySummary tells, after generated inputs, how far they got.
namespace tandem::test {
__attribute__((weak)) int ReplayVerdict() { return 0; }
__attribute__((weak)) void ReplaySummary() {}
}  // namespace tandem::test

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const auto seeds = tandem::test::BuiltinSeeds();
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream out(fs::path(argv[2]) / ("seed-" + std::to_string(i)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(seeds[i].data()), static_cast<std::streamsize>(seeds[i].size()));
    }
    return 0;
  }
  if (argc >= 2 && std::string(argv[1]).rfind("--", 0) == 0 &&
      !(argc == 3 && std::string(argv[1]) == "--write-seeds") && !((argc == 3 || argc == 4) && std::string(argv[1]) == "--random")) {
    std::fprintf(stderr, "usage: %s [CORPUS_DIR...] | --random SECONDS [SEED] | --write-seeds DIR\n", argv[0]);
    return 2;
  }
  StartWatchdog();
  if (argc >= 3 && std::string(argv[1]) == "--random") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(std::atoi(argv[2]));
    const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : std::random_device{}();
    std::mt19937_64 rng(seed);
    const char* last = std::getenv("FUZZ_LAST");
    size_t runs = 0;
    while (std::chrono::steady_clock::now() < until) {
      const Input in = Mutate(seeds, rng);
      if (last) {
        std::ofstream out(last, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
      }
      Run(in.data(), in.size());
      ++runs;
    }
    // On stderr: a backend under test may have taken fd 1 (the CUDA one captures device printf).
    std::fprintf(stderr, "ran %zu generated inputs (seed %llu)\n", runs, static_cast<unsigned long long>(seed));
    tandem::test::ReplaySummary();
    return 0;
  }
  size_t runs = 0;
  for (const auto& s : seeds) runs += Run(s.data(), s.size()) == 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : fs::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      runs += Run(bytes.data(), bytes.size()) == 0;
    }
  }
  std::fprintf(stderr, "replayed %zu inputs\n", runs);
  return tandem::test::ReplayVerdict();
}
