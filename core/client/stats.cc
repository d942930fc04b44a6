#include "stats.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/ir/ir.h"

namespace tandem::client {
namespace {
const auto kStart = std::chrono::steady_clock::now();

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.1f} KiB", n / double(1ull << 10));
  return fmt::format("{} B", n);
}
}  // namespace

Stats& Stats::Get() {
  static Stats* stats = new Stats();  // never destroyed: read from atexit
  return *stats;
}

bool Stats::Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_STATS");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void Stats::Print(size_t servers) const {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart).count();
  std::string out = fmt::format("---- tandem stats (pid {}, {} server{}, {:.3f} s) ----\n", getpid(), servers,
                                servers == 1 ? "" : "s", elapsed);
  std::vector<std::pair<uint64_t, std::string_view>> by_kind;
  for (const auto& c : ir::kCommands) {
    uint64_t n = calls[static_cast<uint16_t>(c.opcode)].load();
    if (n) by_kind.emplace_back(n, c.name);
  }
  std::sort(by_kind.begin(), by_kind.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::string line = "calls:";
  for (auto& [n, name] : by_kind) {
    std::string item = fmt::format(" {} {}", name, n);
    if (line.size() + item.size() > 88) {
      out += line + "\n";
      line = "      ";
    }
    line += item;
  }
  out += line + "\n";
  out += fmt::format("to servers:   {} in {} messages, {} moved by RMA\n", Bytes(bytes_sent), messages_sent.load(),
                     Bytes(rma_to_server));
  out += fmt::format("from servers: {} in {} messages, {} moved by RMA\n", Bytes(bytes_received),
                     messages_received.load(), Bytes(rma_from_server));
  out += fmt::format("server-to-server: {} direct, {} relayed through this process\n", Bytes(server_to_server),
                     Bytes(relayed));
  if (events_imported || events_waited_here)
    out += fmt::format("waits on another server's event: {} server to server, {} waited for here\n",
                       events_imported.load(), events_waited_here.load());
  out += fmt::format("round trips: {}, waiting on the network: {:.3f} s; keepalive warm-ups: {}\n", round_trips.load(),
                     wait_ns.load() / 1e9, keepalives.load());
  if (checkpoints || mismatches || rollbacks || migrations || restores) {
    out += fmt::format("fault tolerance: {} checkpoints ({} saved, {:.3f} s), {} mismatches, {} rollbacks ({:.3f} s, "
                       "{} replicas in place, {} commands replayed), {} replicas restored from a peer, {} migrations ({:.3f} s)\n",
                       checkpoints.load(), Bytes(checkpoint_bytes), checkpoint_ns.load() / 1e9, mismatches.load(),
                       rollbacks.load(), rollback_ns.load() / 1e9, rollbacks_in_place.load(), replayed.load(), restores.load(), migrations.load(),
                       migration_ns.load() / 1e9);
  }
  if (reconnects || resent)
    out += fmt::format("link: {} reconnects to a live session worker, {} request batches resent\n", reconnects.load(),
                       resent.load());
  ssize_t n = ::write(STDERR_FILENO, out.data(), out.size());
  (void)n;
}

}  // namespace tandem::client
