// `tandem bench [--out DIR]`: runs bench/run_bench.sh from the build tree this `tandem` is
// in (<build>/tools/tandem; the script is copied to <build>/bench/ at configure time), with
// that tree's tandemd, so the benchmarks compare native and Tandem in one run.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "tandem_tool.h"

namespace tandem::tool {
namespace fs = std::filesystem;

int Bench(const std::string& out_dir) {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    std::fprintf(stderr, "tandem bench: cannot find this executable: %s\n", ec.message().c_str());
    return 2;
  }
  fs::path build = self.parent_path().parent_path();
  fs::path script = build / "bench" / "run_bench.sh";
  fs::path tandemd = build / "server" / "tandemd";
  for (const fs::path& p : {script, tandemd}) {
    if (!fs::is_regular_file(p, ec)) {
      std::fprintf(stderr, "tandem bench: %s not found: `tandem bench` runs from a build tree (else run bench/run_bench.sh)\n",
                   p.c_str());
      return 2;
    }
  }
  std::string s = script.string(), d = tandemd.string(), t = self.string(), b = build.string();
  char* argv[] = {const_cast<char*>("bash"), s.data(), d.data(), t.data(), b.data(),
                  const_cast<char*>(out_dir.c_str()), nullptr};
  std::fflush(nullptr);
  execvp("bash", argv);
  std::fprintf(stderr, "tandem bench: cannot run bash: %s\n", std::strerror(errno));
  return 127;
}

}  // namespace tandem::tool
