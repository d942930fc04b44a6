// The `tandem` command: `tandem info`, `tandem run` and `tandem bench`.
#include <CLI/CLI.hpp>

#include "tandem_tool.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: use the GPUs of remote tandemd servers as local ones"};
  app.require_subcommand(1);

  std::string info_servers;
  CLI::App* info = app.add_subcommand("info", "List the servers and their devices");
  info->add_option("--servers", info_servers, "host:port[,host:port...] (default: $TANDEM_SERVERS)");

  tandem::tool::RunOptions run_opts;
  std::string run_servers;
  CLI::App* run = app.add_subcommand("run", "Run an unmodified program through Tandem");
  run->add_option("--servers", run_servers, "host:port[,host:port...] (default: $TANDEM_SERVERS)");
  run->add_flag("--no-cuda", run_opts.no_cuda, "Do not LD_PRELOAD Tandem's CUDA runtime");
  run->add_flag("--dry-run", run_opts.dry_run, "Print the environment and the command instead of running it");
  // Everything from the program name on belongs to the program, options included.
  run->add_option("command", run_opts.command, "PROGRAM ARGS (after --)")->required();
  run->positionals_at_end();
  run->footer("Example: tandem run --servers 127.0.0.1:7000 -- ./my_opencl_program --size 4096");

  std::string bench_out = "bench-out";
  CLI::App* bench = app.add_subcommand("bench", "Benchmark native against Tandem in one run (bench/run_bench.sh)");
  bench->add_option("--out", bench_out, "Folder for table.txt, bench.json, bench.png")->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  if (*info) return tandem::tool::Info(info_servers.empty() ? std::nullopt : std::optional(info_servers));
  if (*bench) return tandem::tool::Bench(bench_out);
  if (run_servers.size()) run_opts.servers = run_servers;
  return tandem::tool::Run(run_opts);
}
