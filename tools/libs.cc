// Finding Tandem's front-end libraries from the `tandem` binary's own location, so that
// `tandem run` works from a build tree or an install without any variable set.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tandem_tool.h"

namespace tandem::tool {
namespace fs = std::filesystem;
namespace {

fs::path SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

// The first existing file among `dir/rel` for each rel.
std::string FirstExisting(const fs::path& dir, std::initializer_list<const char*> rels) {
  for (const char* rel : rels) {
    std::error_code ec;
    fs::path p = dir / rel;
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
  }
  return {};
}

// An .icd file is only usable as it is when it names the library by an absolute path that
// exists: otherwise the loader would dlopen a bare name from the library path.
bool IcdUsable(const std::string& icd) {
  std::ifstream in(icd);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  std::error_code ec;
  return !line.empty() && line.front() == '/' && fs::is_regular_file(line, ec);
}

void Search(const fs::path& dir, Libs* libs) {
  libs->searched.push_back(dir.string());
  if (libs->opencl_so.empty())
    libs->opencl_so = FirstExisting(dir, {"libtandem-opencl.so", "frontends/opencl/libtandem-opencl.so"});
  if (libs->opencl_icd.empty()) libs->opencl_icd = FirstExisting(dir, {"tandem.icd", "icd/tandem.icd"});
  if (libs->cudart_so.empty())
    libs->cudart_so = FirstExisting(dir, {"libtandem-cudart.so", "frontends/cuda/libtandem-cudart.so"});
}

}  // namespace

Libs FindLibs() {
  Libs libs;
  if (const char* dir = std::getenv("TANDEM_LIBDIR"); dir && *dir) {
    Search(dir, &libs);  // an explicit folder is the only place looked in
  } else {
    fs::path self = SelfDir();
    Search(self.parent_path(), &libs);                  // build tree: <build>/tools/tandem
    Search(self.parent_path() / "lib" / "tandem", &libs);  // install: <prefix>/bin/tandem
  }
  if (!libs.opencl_icd.empty() && !IcdUsable(libs.opencl_icd)) libs.opencl_icd.clear();
  return libs;
}

}  // namespace tandem::tool
