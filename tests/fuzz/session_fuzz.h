// The fuzz entry point over a session worker's batch handling (see session_fuzz.cc) and
// the seeds both the fuzzer and the replay test start from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tandem::test {

// Input layout: byte 0 is the mode (bit 0 set: skip the Attach, exercising authentication);
// then messages, each a u32 little-endian length and that many bytes; bytes left over form
// one last message.
std::vector<std::vector<uint8_t>> BuiltinSeeds();

}  // namespace tandem::test
