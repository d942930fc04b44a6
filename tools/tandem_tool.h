// The `tandem` command's subcommands. Each returns the process exit status.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::tool {

// Where the front-end libraries of this Tandem are (empty strings when absent).
struct Libs {
  std::string opencl_so;  // libtandem-opencl.so
  std::string opencl_icd; // tandem.icd naming it by an absolute path
  std::string cudart_so;  // libtandem-cudart.so (LD_PRELOAD)
  std::vector<std::string> searched;  // the folders looked in, for error messages
};

// Looks in $TANDEM_LIBDIR if set, else relative to this executable: the build tree
// (<build>/tools/tandem → <build>/frontends/..., <build>/icd/) or an installed
// <prefix>/bin/tandem → <prefix>/lib/tandem/.
Libs FindLibs();

struct RunOptions {
  std::optional<std::string> servers;  // overrides TANDEM_SERVERS
  bool no_cuda = false;                // do not LD_PRELOAD the CUDA runtime
  bool dry_run = false;                // print the environment and command, do not exec
  std::vector<std::string> command;
};

int Info(const std::optional<std::string>& servers);
int Run(const RunOptions& opts);
// Runs <build>/bench/run_bench.sh with this build's tandemd; results go to out_dir.
int Bench(const std::string& out_dir);

}  // namespace tandem::tool
