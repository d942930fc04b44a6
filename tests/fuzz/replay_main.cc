// The fuzz entry point run over its seeds in every build, so it cannot rot: the built-in
// seeds, then every file of the directories named on the command line (the corpus).
// `--write-seeds DIR` writes the built-in seeds out as a starting corpus for libFuzzer.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "session_fuzz.h"

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
  size_t runs = 0;
  for (const auto& s : seeds) runs += LLVMFuzzerTestOneInput(s.data(), s.size()) == 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : fs::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      runs += LLVMFuzzerTestOneInput(bytes.data(), bytes.size()) == 0;
    }
  }
  std::printf("replayed %zu inputs\n", runs);
  return 0;
}
