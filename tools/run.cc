// `tandem run -- PROGRAM ARGS`: makes an unmodified program use Tandem, then execs it.
//   OpenCL: OCL_ICD_VENDORS (Debian's ocl-icd: a directory, an .icd or the .so) and
//           OCL_ICD_FILENAMES (the Khronos loader) name only Tandem's ICD, so Tandem is
//           the platform the program sees.
//   CUDA:   LD_PRELOAD of libtandem-cudart.so (when it was built) stands in for libcudart.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem_tool.h"

namespace tandem::tool {
namespace {

void Set(const char* name, const std::string& value, bool print) {
  setenv(name, value.c_str(), 1);
  if (print) std::printf("%s=%s\n", name, value.c_str());
}

}  // namespace

int Run(const RunOptions& opts) {
  if (opts.command.empty()) {
    std::fprintf(stderr, "tandem run: no program given (tandem run [--servers LIST] -- PROGRAM ARGS)\n");
    return 2;
  }
  std::string servers = opts.servers ? *opts.servers : "";
  if (!opts.servers)
    if (const char* env = std::getenv("TANDEM_SERVERS")) servers = env;
  if (servers.empty()) {
    std::fprintf(stderr, "tandem run: no servers: pass --servers host:port[,...] or set TANDEM_SERVERS\n");
    return 2;
  }

  Libs libs = FindLibs();
  if (libs.opencl_so.empty() && libs.cudart_so.empty()) {
    std::string where;
    for (const auto& d : libs.searched) where += (where.empty() ? "" : ", ") + d;
    std::fprintf(stderr,
                 "tandem run: no Tandem front-end library (libtandem-opencl.so, libtandem-cudart.so) in %s; "
                 "build them or set TANDEM_LIBDIR\n",
                 where.c_str());
    return 2;
  }

  bool print = opts.dry_run;
  Set("TANDEM_SERVERS", servers, print);
  if (!libs.opencl_so.empty()) {
    Set("OCL_ICD_VENDORS", libs.opencl_icd.empty() ? libs.opencl_so : libs.opencl_icd, print);
    Set("OCL_ICD_FILENAMES", libs.opencl_so, print);
  }
  if (!libs.cudart_so.empty() && !opts.no_cuda) {
    std::string preload = libs.cudart_so;
    if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
    Set("LD_PRELOAD", preload, print);
  }
  if (opts.dry_run) {
    for (const auto& a : opts.command) std::printf("%s%s", a.c_str(), &a == &opts.command.back() ? "\n" : " ");
    return 0;
  }

  std::vector<char*> argv;
  for (const auto& a : opts.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  execvp(argv[0], argv.data());
  int err = errno;
  std::fprintf(stderr, "tandem run: cannot run %s: %s\n", argv[0], std::strerror(err));
  return err == ENOENT ? 127 : 126;  // the shell's codes for "not found" and "not executable"
}

}  // namespace tandem::tool
