// Process-wide counters for TANDEM_STATS=1: what the program asked for and what it cost.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace tandem::client {

struct Stats {
  std::array<std::atomic<uint64_t>, 0x10000> calls{};  // by opcode
  std::atomic<uint64_t> messages_sent{0}, bytes_sent{0};
  std::atomic<uint64_t> messages_received{0}, bytes_received{0};
  std::atomic<uint64_t> rma_to_server{0}, rma_from_server{0};  // bulk bytes the server moved
  std::atomic<uint64_t> server_to_server{0}, relayed{0};  // copies between servers: direct, relayed here
  // Waits on another server's event: told server to server, or waited for here.
  std::atomic<uint64_t> events_imported{0}, events_waited_here{0};
  std::atomic<uint64_t> keepalives{0};  // Warm round trips
  std::atomic<uint64_t> reconnects{0}, resent{0};  // transient link losses: resumes, batches sent again
  // Fault tolerance.
  std::atomic<uint64_t> checkpoints{0}, checkpoint_bytes{0}, checkpoint_ns{0};
  std::atomic<uint64_t> mismatches{0}, rollbacks{0}, rollbacks_in_place{0}, rollback_ns{0}, replayed{0}, restores{0};
  std::atomic<uint64_t> migrations{0}, migration_ns{0};
  std::atomic<uint64_t> round_trips{0};
  std::atomic<uint64_t> wait_ns{0};  // time application threads spent waiting on servers

  static Stats& Get();
  static bool Enabled();
  void AddWait(std::chrono::steady_clock::duration d) {
    wait_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    ++round_trips;
  }
  // The one-screen summary printed at exit.
  void Print(size_t servers) const;
};

}  // namespace tandem::client
