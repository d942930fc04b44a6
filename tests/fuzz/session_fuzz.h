// A fuzz target's entry point and the seeds both the fuzzer and the replay test start from:
// each target (session_fuzz.cc, fabric_fuzz.cc) is its own binary defining both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tandem::test {

// session_fuzz's input: byte 0 is the mode (bit 0 set: skip the Attach, exercising
// authentication); then messages, each a u32 little-endian length and that many bytes; bytes
// left over form one last message. fabric_fuzz's: frames, each a u16 length and its bytes.
// peer_link_fuzz's: messages, each a u16 length and its bytes.
std::vector<std::vector<uint8_t>> BuiltinSeeds();
// After a replay of the seeds and corpora: 0 when it passed. Optional (replay_main's default
// says 0); the CUDA backend target checks that its seeds reached a launch and a write.
int ReplayVerdict();
// After generated inputs (--random): how far they got, on stderr. Optional; the CUDA backend
// target counts its successful launches and writes.
void ReplaySummary();

}  // namespace tandem::test
