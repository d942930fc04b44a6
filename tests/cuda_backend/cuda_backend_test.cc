// In-process tests of the CUDA backend: MakeCudaBackend called directly, commands run as a
// session worker runs them. Without a GPU (or libcuda) they skip, except the one that checks
// that MakeCudaBackend then fails cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <optional>
#include <thread>

#include "tandem/server/backend.h"

#ifdef TANDEM_TEST_OUTPUT_CAPTURE
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cuda_output.h"
#endif

namespace tandem::server {
namespace {

// CUDA values the tests compare with (cuda.h is not needed to build the tests).
constexpr int32_t kCudaErrorNotFound = 500;        // CUDA_ERROR_NOT_FOUND
constexpr int32_t kCudaErrorIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr uint32_t kAttrWarpSize = 10;             // CU_DEVICE_ATTRIBUTE_WARP_SIZE
constexpr uint32_t kAttrMultiprocessors = 16;      // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr uint32_t kFuncMaxThreads = 0;            // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr uint32_t kFuncMaxDynamicShared = 8;      // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

constexpr uint64_t kBase = ir::kCudaVaBase;
constexpr uint64_t kRange = 1ull << 34;  // 16 GiB of the client's range

// BulkIO over this process's memory: Region.addr is a host pointer. Chunks are deliberately
// not a multiple of the backend's staging chunk.
class HostBulk : public BulkIO {
 public:
  static constexpr size_t kChunk = (3u << 20) + 5;
  Status Pull(const ir::Region& remote, size_t len,
              const std::function<Status(const uint8_t*, size_t, size_t)>& sink) override {
    const auto* p = reinterpret_cast<const uint8_t*>(remote.addr);
    for (size_t off = 0; off < len; off += kChunk) TANDEM_RETURN_IF_ERROR(sink(p + off, off, std::min(kChunk, len - off)));
    return Status::Ok();
  }
  Status Push(const ir::Region& remote, size_t len, const std::function<Status(uint8_t*, size_t, size_t)>& source) override {
    std::vector<uint8_t> own(staging ? 0 : kChunk);
    auto* p = reinterpret_cast<uint8_t*>(remote.addr);
    for (size_t off = 0, i = 0; off < len; off += kChunk, ++i) {
      // Like FabricBulk: the backend's staging memory (Backend::BulkStaging), slot by slot.
      uint8_t* chunk = staging ? staging->data() + (i % kSlots) * kChunk : own.data();
      const size_t n = std::min(kChunk, len - off);
      TANDEM_RETURN_IF_ERROR(source(chunk, off, n));
      std::memcpy(p + off, chunk, n);
    }
    return Status::Ok();
  }
  static constexpr size_t kSlots = 3;
  std::shared_ptr<HostBuffer> staging;  // null: ordinary memory of its own
};

std::optional<ir::bytes> ReadFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return ir::bytes(std::istreambuf_iterator<char>(in), {});
}

template <class T>
ir::bytes Bytes(const T& v) {
  ir::bytes b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

const ir::Prop* FindProp(const ir::PropList& props, uint32_t key) {
  for (const auto& p : props)
    if (p.key == key) return &p;
  return nullptr;
}

int32_t PropI32(const ir::Prop& p) {
  int32_t v = 0;
  std::memcpy(&v, p.value.data(), std::min<size_t>(4, p.value.size()));
  return v;
}

TEST(CudaBackendStart, FailsCleanlyOrServesDevices) {
  auto made = MakeCudaBackend(BackendOptions{});
  if (!made.ok()) {
    // No driver, no device or a build without CUDA headers: a status, never a crash.
    EXPECT_FALSE(made.status().message().empty());
    EXPECT_TRUE(made.status().code() == Code::kUnimplemented || made.status().code() == Code::kApiError)
        << made.status().ToString();
    return;
  }
  EXPECT_GT(made.value()->device_count(), 0u);
  EXPECT_EQ(made.value()->name(), "cuda");
  made.value().reset();
  // A device filter naming a device that does not exist is refused.
  auto filtered = MakeCudaBackend(BackendOptions{"0,999"});
  ASSERT_FALSE(filtered.ok());
  EXPECT_EQ(filtered.status().code(), Code::kInvalidArgument) << filtered.status().ToString();
  auto garbage = MakeCudaBackend(BackendOptions{"zero"});
  EXPECT_EQ(garbage.status().code(), Code::kInvalidArgument) << garbage.status().ToString();
}

#ifdef TANDEM_TEST_OUTPUT_CAPTURE
// Device printf arrives on fd 1; the capture must keep every byte, in order, even when far
// more than a pipe holds is written before anyone takes it (the driver must never block).
TEST(CudaOutputCapture, KeepsStdoutInOrderWithoutBlocking) {
  auto started = cuda::OutputCapture::Start();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto capture = std::move(started.value());
  std::string expected, line(1000, 'x');
  bool written = true;
  for (int i = 0; i < 4000 && written; ++i) {  // about 4 MB through write(2), as a driver would
    line.replace(0, 8, fmt::format("{:08d}", i));
    written = ::write(1, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    expected += line;
  }
  std::printf("left in libc's buffer");  // Take() flushes it
  expected += "left in libc's buffer";
  const std::string got = capture->Take();
  const std::string again = capture->Take();
  capture.reset();  // gtest's own output reaches the terminal again from here
  EXPECT_TRUE(written);
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected);
  EXPECT_TRUE(again.empty());
  EXPECT_NE(::fcntl(1, F_GETFD), -1);
}
#endif

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = MakeCudaBackend(BackendOptions{});
    if (!made.ok()) GTEST_SKIP() << "no usable CUDA backend here: " << made.status().ToString();
    b_ = std::move(made.value());
    b_->set_bulk(&bulk_);
  }
  void TearDown() override {
    if (!b_) return;
    // gtest reports failures on stdout, which the backend captures: pass them on.
    for (const auto& [fd, text] : b_->TakeOutput()) std::fwrite(text.data(), 1, text.size(), stderr);
    b_.reset();
  }

  uint64_t Reserve() {
    ir::AddressReserveRep rep;
    Status st = b_->OnAddressReserve({0, kBase, kRange}, &rep);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rep.granularity;
  }
  Status Alloc(uint64_t buffer, uint64_t address, uint64_t size) {
    return b_->OnBufferAlloc({buffer, 0, size, 0, address}, nullptr);
  }
  Status Write(uint64_t buffer, uint64_t offset, const ir::bytes& data, uint64_t stream = 0) {
    ir::BufferWriteReq req;
    req.stream = stream;
    req.buffer = buffer;
    req.offset = offset;
    req.size = data.size();
    req.data = data;
    return b_->OnBufferWrite(req, nullptr);
  }
  Result<ir::bytes> Read(uint64_t buffer, uint64_t offset, uint64_t size, uint64_t stream = 0) {
    ir::BufferReadReq req;
    req.stream = stream;
    req.buffer = buffer;
    req.offset = offset;
    req.size = size;
    ir::BufferReadRep rep;
    Status st = b_->OnBufferRead(req, &rep);
    if (!st.ok()) return st;
    return rep.data;
  }
  Status LoadModule(uint64_t module, const char* path) {
    auto image = ReadFile(path);
    if (!image) return Status::Invalid(std::string("cannot read ") + path);
    return b_->OnModuleLoad({module, 0, static_cast<uint32_t>(ir::ModuleKind::kCudaImage), *image}, nullptr);
  }
  Result<ir::FunctionInfo> GetFunction(uint64_t function, uint64_t module, const std::string& name) {
    ir::FunctionGetRep rep;
    Status st = b_->OnFunctionGet({function, module, name}, &rep);
    if (!st.ok()) return st;
    return rep.info;
  }
  Status Launch(uint64_t function, uint64_t grid, uint64_t block, std::vector<ir::bytes> args, uint64_t stream = 0,
                std::vector<uint64_t> wait = {}, uint64_t signal = 0) {
    ir::LaunchReq req;
    req.stream = stream;
    req.function = function;
    req.dims = 1;
    req.grid = {grid};
    req.block = {block};
    for (auto& a : args) req.args.push_back(ir::LaunchArg{static_cast<uint32_t>(ir::ArgKind::kBytes), 0, std::move(a)});
    req.wait = std::move(wait);
    req.signal = signal;
    return b_->OnLaunch(req, nullptr);
  }
  Status Sync() { return b_->OnDeviceSync({0}, nullptr); }

  HostBulk bulk_;
  std::unique_ptr<Backend> b_;
};

#define ASSERT_OK(expr)                                  \
  do {                                                   \
    ::tandem::Status _st = (expr);                       \
    ASSERT_TRUE(_st.ok()) << #expr ": " << _st.ToString(); \
  } while (0)

#define REQUIRE_MODULES()                                                       \
  do {                                                                          \
    if (std::string(kFatbin).empty()) GTEST_SKIP() << "built without nvcc: no test modules"; \
  } while (0)

#ifdef TANDEM_TEST_FATBIN
constexpr const char* kFatbin = TANDEM_TEST_FATBIN;
constexpr const char* kDynamicFatbin = TANDEM_TEST_DYNAMIC_FATBIN;
#else
constexpr const char* kFatbin = "";
constexpr const char* kDynamicFatbin = "";
#endif

TEST_F(CudaBackendTest, DeviceInfo) {
  ir::DeviceInfoRep rep;
  ASSERT_OK(b_->OnDeviceInfo({0}, &rep));
  EXPECT_EQ(rep.api, static_cast<uint32_t>(Api::kCuda));
  EXPECT_EQ(rep.platform, "CUDA");
  EXPECT_FALSE(rep.name.empty());
  const ir::Prop* warp = FindProp(rep.props, ir::kCudaAttrBase + kAttrWarpSize);
  ASSERT_NE(warp, nullptr);
  EXPECT_EQ(PropI32(*warp), 32);
  const ir::Prop* sms = FindProp(rep.props, ir::kCudaAttrBase + kAttrMultiprocessors);
  ASSERT_NE(sms, nullptr);
  EXPECT_GT(PropI32(*sms), 0);
  EXPECT_GT(rep.props.size(), 50u);
  const ir::Prop* total = FindProp(rep.props, ir::kCudaTotalMem);
  ASSERT_NE(total, nullptr);
  ASSERT_EQ(total->value.size(), 8u);
  uint64_t bytes = 0;
  std::memcpy(&bytes, total->value.data(), 8);
  EXPECT_GT(bytes, 1ull << 30);
  const ir::Prop* uuid = FindProp(rep.props, ir::kCudaUuid);
  ASSERT_NE(uuid, nullptr);
  EXPECT_EQ(uuid->value.size(), 16u);
  const ir::Prop* version = FindProp(rep.props, ir::kCudaDriverVersion);
  ASSERT_NE(version, nullptr);
  EXPECT_GE(PropI32(*version), 12000);

  EXPECT_EQ(b_->OnDeviceInfo({b_->device_count()}, &rep).code(), Code::kInvalidArgument);
  ir::MemInfoRep mem;
  ASSERT_OK(b_->OnMemInfo({0}, &mem));
  EXPECT_GT(mem.total, 0u);
  EXPECT_LE(mem.free, mem.total);
  // The context's stream priorities: 0 is the least, greater ones are negative.
  ir::PriorityRangeRep prio{1, 1};
  ASSERT_OK(b_->OnPriorityRange({0}, &prio));
  EXPECT_EQ(prio.least, 0);
  EXPECT_LT(prio.greatest, 0);
  EXPECT_EQ(b_->OnPriorityRange({b_->device_count()}, &prio).code(), Code::kInvalidArgument);
}

TEST_F(CudaBackendTest, AddressReserveAtClientBase) {
  const uint64_t g = Reserve();
  ASSERT_GT(g, 0u);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity " << g;
  ir::AddressReserveRep rep;
  // The same range again is accepted; an overlapping or misaligned one is not.
  ASSERT_OK(b_->OnAddressReserve({0, kBase, kRange}, &rep));
  EXPECT_EQ(b_->OnAddressReserve({0, kBase + g, kRange}, &rep).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnAddressReserve({0, kBase + kRange + 1, g}, &rep).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnAddressReserve({0, kBase + kRange, 0}, &rep).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnAddressReserve({b_->device_count(), kBase + kRange, g}, &rep).code(), Code::kInvalidArgument);
  // The range of the client's next virtual device. (A small range right after the first
  // one was refused by driver 580: it placed it elsewhere.)
  ASSERT_OK(b_->OnAddressReserve({0, kBase + ir::kCudaVaPerDevice, kRange}, &rep));
}

TEST_F(CudaBackendTest, MemoryRoundTripAndAbsoluteAddressing) {
  const uint64_t g = Reserve();
  ASSERT_OK(Alloc(1, kBase, (1u << 20) + 3));
  ASSERT_OK(Alloc(2, kBase + 4 * g, 1u << 20));
  // Overlapping, misaligned, outside the reservation, duplicate handle, no address.
  EXPECT_EQ(Alloc(3, kBase + 4 * g, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(Alloc(3, kBase + g + 16, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(Alloc(3, kBase + kRange, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(Alloc(3, kBase + kRange - g, 2 * g).code(), Code::kInvalidArgument);
  EXPECT_EQ(Alloc(1, kBase + 8 * g, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(Alloc(3, 0, 16).code(), Code::kInvalidArgument);

  ir::bytes pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_OK(Write(1, 100, pattern));
  auto back = Read(1, 100, pattern.size());
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), pattern);

  // Copy into buffer 2, then address both by absolute address (buffer 0).
  ASSERT_OK(b_->OnBufferCopy({0, 1, 100, 2, 8, pattern.size(), {}, 0}, nullptr));
  back = Read(0, kBase + 4 * g + 8, pattern.size());
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), pattern);
  ASSERT_OK(Write(0, kBase + 16, ir::bytes{1, 2, 3, 4}));
  back = Read(1, 16, 4);
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), (ir::bytes{1, 2, 3, 4}));
  ASSERT_OK(b_->OnBufferCopy({0, 0, kBase + 16, 0, kBase + 4 * g, 4, {}, 0}, nullptr));
  back = Read(2, 0, 4);
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), (ir::bytes{1, 2, 3, 4}));

  // Fills of 1, 2 and 4 bytes.
  ASSERT_OK(b_->OnBufferFill({0, 2, 0, 8, {0xAB}, {}, 0}, nullptr));
  ASSERT_OK(b_->OnBufferFill({0, 2, 8, 8, {0x01, 0x02}, {}, 0}, nullptr));
  ASSERT_OK(b_->OnBufferFill({0, 0, kBase + 4 * g + 16, 8, {0x10, 0x20, 0x30, 0x40}, {}, 0}, nullptr));
  back = Read(2, 0, 24);
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), (ir::bytes{0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 1, 2, 1, 2, 1, 2, 1, 2, 0x10, 0x20,
                                     0x30, 0x40, 0x10, 0x20, 0x30, 0x40}));
  EXPECT_EQ(b_->OnBufferFill({0, 2, 0, 9, {1, 2, 3}, {}, 0}, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnBufferFill({0, 2, 1, 8, {1, 2, 3, 4}, {}, 0}, nullptr).code(), Code::kInvalidArgument);

  // Out of range, by handle and by address; unknown handles.
  EXPECT_EQ(Read(1, (1u << 20), 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Read(1, UINT64_MAX - 1, 4).status().code(), Code::kInvalidArgument);
  Status st = Read(0, kBase + (1u << 20) + 3, 1).status();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("0x200000100003"), std::string::npos) << st.message();
  EXPECT_EQ(Read(0, kBase + (1u << 20), 4).status().code(), Code::kInvalidArgument);  // runs past the end
  EXPECT_EQ(Read(0, 0x1000, 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Read(42, 0, 4).status().code(), Code::kUnknownHandle);
  EXPECT_EQ(Write(1, 0, pattern, 77).code(), Code::kUnknownHandle);
  EXPECT_EQ(b_->OnBufferCopy({0, 1, 0, 2, (1u << 20) - 4, 8, {}, 0}, nullptr).code(), Code::kInvalidArgument);

  ASSERT_OK(b_->OnBufferFree({2}, nullptr));
  EXPECT_EQ(b_->OnBufferFree({2}, nullptr).code(), Code::kUnknownHandle);
  EXPECT_EQ(Read(0, kBase + 4 * g, 4).status().code(), Code::kInvalidArgument);
  // The freed range can be mapped again.
  ASSERT_OK(Alloc(4, kBase + 4 * g, pattern.size()));
  ASSERT_OK(Write(4, 0, pattern));
}

TEST_F(CudaBackendTest, RectCopy) {
  const uint64_t g = Reserve();
  ASSERT_OK(Alloc(1, kBase, 4096));
  ASSERT_OK(Alloc(2, kBase + g, 4096));
  ir::bytes src(16 * 8);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  ASSERT_OK(Write(1, 0, src));
  ASSERT_OK(b_->OnBufferFill({0, 2, 0, 256, {0}, {}, 0}, nullptr));
  // 4 bytes x 3 rows from (2, 1) of a 16-byte-pitch source to (0, 0) of an 8-byte-pitch destination.
  ir::BufferCopyRectReq req{0, 1, 2, {2, 1, 0}, {0, 0, 0}, {4, 3, 1}, {16, 0, 8, 0}, {}, 0};
  ASSERT_OK(b_->OnBufferCopyRect(req, nullptr));
  auto back = Read(2, 0, 24);
  ASSERT_OK(back.status());
  for (size_t y = 0; y < 3; ++y)
    for (size_t x = 0; x < 8; ++x) EXPECT_EQ(back.value()[y * 8 + x], x < 4 ? (y + 1) * 16 + 2 + x : 0) << y << "," << x;
  // Absolute addressing: the origin's first value is the address.
  ir::BufferCopyRectReq abs{0, 0, 0, {kBase, 0, 0}, {kBase + g + 64, 0, 0}, {2, 2, 2}, {16, 64, 2, 4}, {}, 0};
  ASSERT_OK(b_->OnBufferCopyRect(abs, nullptr));
  back = Read(2, 64, 8);
  ASSERT_OK(back.status());
  EXPECT_EQ(back.value(), (ir::bytes{0, 1, 16, 17, 64, 65, 80, 81}));
  // A region past the end of the source.
  req.region = {4, 300, 1};
  EXPECT_EQ(b_->OnBufferCopyRect(req, nullptr).code(), Code::kInvalidArgument);
  req.region = {4, 3};
  EXPECT_EQ(b_->OnBufferCopyRect(req, nullptr).code(), Code::kInvalidArgument);
  // An origin whose offset sum wraps 128 bits (the review's): once accepted, copying from the
  // wrong address.
  ir::BufferCopyRectReq wrap{0, 0, 0, {3, (uint64_t{1} << 63) + (uint64_t{1} << 43) - 1, UINT64_MAX},
                             {kBase + g + 64, 0, 0}, {1, 1, 1}, {4, UINT64_MAX, 0, 0}, {}, 0};
  EXPECT_EQ(b_->OnBufferCopyRect(wrap, nullptr).code(), Code::kInvalidArgument);
}

// Writes a pattern of 10 MiB + 123 B from `host` into buffer 1 through the bulk channel,
// reads it back from `offset` on the same way, and checks the bytes. The write goes to `*write`.
void BulkRoundTrip(Backend& b, uint64_t offset, std::vector<uint8_t>& host, ir::BufferWriteReq* write) {
  const size_t size = (10u << 20) + 123;
  host.resize(size);
  std::vector<uint8_t> back(size, 0);
  for (size_t i = 0; i < size; ++i) host[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  ir::BufferWriteReq& w = *write;
  w.buffer = 1;
  w.size = size;
  w.remote = ir::Region{reinterpret_cast<uint64_t>(host.data()), size, 1};
  ASSERT_OK(b.OnBufferWrite(w, nullptr));
  ir::BufferReadReq r;
  r.buffer = 1;
  r.offset = offset;
  r.size = size - offset;
  r.remote = ir::Region{reinterpret_cast<uint64_t>(back.data()), size, 1};
  ir::BufferReadRep rep;
  ASSERT_OK(b.OnBufferRead(r, &rep));
  EXPECT_TRUE(rep.data.empty());
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + (size - offset), host.begin() + offset));
}

TEST_F(CudaBackendTest, BulkTransfersThroughStaging) {
  Reserve();
  ASSERT_OK(Alloc(1, kBase, (10u << 20) + 123));
  std::vector<uint8_t> host;
  ir::BufferWriteReq w;
  BulkRoundTrip(*b_, 0, host, &w);
  // A region smaller than the transfer is refused.
  w.remote.len = w.size - 1;
  EXPECT_EQ(b_->OnBufferWrite(w, nullptr).code(), Code::kInvalidArgument);
}

// With the backend's own pinned staging, a read to the client is copied by the device
// straight into each chunk; the bytes must be the same as through its staging slots.
TEST_F(CudaBackendTest, BulkReadsStraightIntoPinnedStaging) {
  Reserve();
  auto staging = b_->BulkStaging(HostBulk::kSlots * HostBulk::kChunk);
  ASSERT_OK(staging.status());
  ASSERT_GE(staging.value()->size(), HostBulk::kSlots * HostBulk::kChunk);
  bulk_.staging = staging.value();
  ASSERT_OK(Alloc(1, kBase, (10u << 20) + 123));
  std::vector<uint8_t> host;
  ir::BufferWriteReq w;
  BulkRoundTrip(*b_, 7, host, &w);  // an odd start, so no chunk is aligned on the device
  bulk_.staging.reset();
}

// The bulk channel takes its staging once and keeps it for the session (FabricBulk), so a
// device reset, which ends the context that pinned it, must leave that memory usable: the
// round trips after the reset go through the same staging, and their bytes must be right.
TEST_F(CudaBackendTest, BulkStagingOutlivesADeviceReset) {
  Reserve();
  auto staging = b_->BulkStaging(HostBulk::kSlots * HostBulk::kChunk);
  ASSERT_OK(staging.status());
  bulk_.staging = staging.value();
  std::vector<uint8_t> host;
  ir::BufferWriteReq w;
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK(Alloc(1, kBase, (10u << 20) + 123));
    BulkRoundTrip(*b_, 5 * round, host, &w);
    // A small read too: it goes through the device's pinned read buffer.
    auto small = Read(1, 11, 4096);
    ASSERT_OK(small.status());
    EXPECT_TRUE(std::equal(small->begin(), small->end(), host.begin() + 11)) << "round " << round;
    ASSERT_OK(b_->OnDeviceReset({0}, nullptr));
    std::memset(staging.value()->data(), 0x5a, staging.value()->size());  // still this process's memory
  }
  bulk_.staging.reset();
}

// A session that ends while a user event it never set still holds a stream, after pinned
// buffers were used (the bulk staging, the read buffer), must still end: the backend may not
// wait for that stream on its way out (freeing pinned memory can wait for the device).
TEST_F(CudaBackendTest, EndsWithAHeldStreamAfterPinnedBuffersWereUsed) {
  Reserve();
  ASSERT_OK(Alloc(1, kBase, 1u << 20));
  ASSERT_OK(Write(1, 0, ir::bytes(4096, 7)));
  ASSERT_OK(Read(1, 0, 4096).status());
  {
    auto staging = b_->BulkStaging(HostBulk::kSlots * HostBulk::kChunk);
    ASSERT_OK(staging.status());
  }
  ASSERT_OK(b_->OnStreamCreate({5, 0, ir::kStreamNonBlocking, 0}, nullptr));
  ASSERT_OK(b_->OnEventCreate({32, 0, ir::kEventUser}, nullptr));
  ASSERT_OK(b_->OnMarker({5, 0, {32}, 0}, nullptr));
  ASSERT_OK(Write(1, 0, ir::bytes(4096, 9), 5));  // queued behind the held marker
  auto ended = std::make_shared<std::promise<void>>();
  auto done = ended->get_future();
  std::thread([b = std::move(b_), ended]() mutable {
    b.reset();
    ended->set_value();
  }).detach();
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // On stderr: the backend being torn down still captures stdout, where gtest reports.
    std::fprintf(stderr, "FAILED: the backend's teardown did not end within 60 s (a stream held by an unset user event)\n");
    std::_Exit(1);  // the stuck thread would hold the process forever
  }
}

// Inline reads up to 64 KiB land in the device's pinned read buffer and are copied into the
// reply; larger ones go straight into it. Each read, on the default stream or another, of
// each size around the limit, must return its own bytes (the buffer is reused every time),
// and a failed signal must not leave the read half done.
TEST_F(CudaBackendTest, InlineReadsThroughThePinnedReadBuffer) {
  Reserve();
  const size_t size = 1u << 20;
  ASSERT_OK(Alloc(1, kBase, size));
  ASSERT_OK(b_->OnStreamCreate({5, 0, ir::kStreamNonBlocking, 0}, nullptr));
  std::vector<uint8_t> host(size);
  for (size_t i = 0; i < size; ++i) host[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
  ASSERT_OK(Write(1, 0, ir::bytes(host.begin(), host.end())));
  ASSERT_OK(Sync());
  for (uint64_t stream : {uint64_t{0}, uint64_t{5}}) {
    for (size_t n : {size_t{0}, size_t{8}, size_t{4096}, ir::kInlineDataLimit, ir::kInlineDataLimit + 1, size_t{300000}}) {
      const uint64_t offset = 3 + n % 1000 + stream;
      auto got = Read(1, offset, n, stream);
      ASSERT_OK(got.status());
      ASSERT_EQ(got.value().size(), n);
      EXPECT_TRUE(std::equal(got.value().begin(), got.value().end(), host.begin() + offset))
          << n << " bytes on stream " << stream;
    }
  }
  ir::BufferReadReq bad;
  bad.buffer = 1;
  bad.size = 16;
  bad.signal = 77;  // never created: the read fails, and the buffer is free again after it
  ir::BufferReadRep rep;
  EXPECT_FALSE(b_->OnBufferRead(bad, &rep).ok());
  auto again = Read(1, 100, 16);
  ASSERT_OK(again.status());
  EXPECT_TRUE(std::equal(again.value().begin(), again.value().end(), host.begin() + 100));
}

TEST_F(CudaBackendTest, ModuleFollowsPointerInDeviceMemory) {
  REQUIRE_MODULES();
  const uint64_t g = Reserve();
  ASSERT_OK(LoadModule(1, kFatbin));
  ir::ModuleBuildRep built;
  ASSERT_OK(b_->OnModuleBuild({1, ""}, &built));
  EXPECT_EQ(built.status, 0);
  EXPECT_TRUE(built.log.empty());
  auto follow = GetFunction(10, 1, "follow");
  ASSERT_OK(follow.status());
  ASSERT_EQ(follow->num_params, 3u);
  EXPECT_EQ(follow->params[0].size, 8u);
  EXPECT_EQ(follow->params[1].size, 8u);
  EXPECT_EQ(follow->params[1].offset, 8u);
  EXPECT_EQ(follow->params[2].size, 4u);
  EXPECT_GT(follow->max_block, 0u);
  EXPECT_EQ(follow->preferred_multiple, 32u);
  ASSERT_NE(FindProp(follow->attrs, ir::kCudaFuncAttrBase + kFuncMaxThreads), nullptr);

  // values at kBase, a table of pointers to them at kBase + g, results at kBase + 2g.
  const int n = 64;
  ASSERT_OK(Alloc(1, kBase, n * 4));
  ASSERT_OK(Alloc(2, kBase + g, n * 8));
  ASSERT_OK(Alloc(3, kBase + 2 * g, n * 4));
  std::vector<int32_t> values(n);
  std::vector<uint64_t> table(n);
  for (int i = 0; i < n; ++i) {
    values[i] = i * 10;
    table[i] = kBase + 4 * static_cast<uint64_t>(n - 1 - i);  // reversed
  }
  ASSERT_OK(Write(1, 0, ir::bytes(reinterpret_cast<uint8_t*>(values.data()), reinterpret_cast<uint8_t*>(values.data() + n))));
  ASSERT_OK(Write(2, 0, ir::bytes(reinterpret_cast<uint8_t*>(table.data()), reinterpret_cast<uint8_t*>(table.data() + n))));
  ASSERT_OK(Launch(10, 2, 32, {Bytes(kBase + g), Bytes(kBase + 2 * g), Bytes(n)}));
  auto out = Read(3, 0, n * 4);
  ASSERT_OK(out.status());
  for (int i = 0; i < n; ++i) {
    int32_t v;
    std::memcpy(&v, out->data() + 4 * i, 4);
    EXPECT_EQ(v, (n - 1 - i) * 10 + 1) << i;
  }

  // The mangled C++ kernel, on a stream of its own.
  ASSERT_OK(b_->OnStreamCreate({5, 0, ir::kStreamNonBlocking, -1}, nullptr));
  auto scale = GetFunction(11, 1, "_Z5scalePffi");
  ASSERT_OK(scale.status());
  ASSERT_OK(Launch(11, 1, 64, {Bytes(kBase), Bytes(2.0f), Bytes(n)}, 5));  // the ints, as floats: 0 stays 0
  ASSERT_OK(b_->OnStreamSync({5}, nullptr));
  ASSERT_OK(b_->OnStreamDestroy({5}, nullptr));
}

// cudaDeviceSetLimit / GetLimit, cache preferences and the bus id: the driver's answers, and
// clear refusals of what the driver would not be asked (unknown device or function, a cache
// configuration out of range).
TEST_F(CudaBackendTest, LimitsCacheConfigAndBusId) {
  ir::DeviceInfoRep info;
  ASSERT_OK(b_->OnDeviceInfo({0}, &info));
  const ir::Prop* bus = FindProp(info.props, ir::kCudaPciBusId);
  ASSERT_NE(bus, nullptr);
  const std::string bus_id(bus->value.begin(), bus->value.end());
  EXPECT_EQ(std::count(bus_id.begin(), bus_id.end(), ':'), 2) << bus_id;

  constexpr uint32_t kLimitMallocHeapSize = 0x02;  // CU_LIMIT_MALLOC_HEAP_SIZE
  ASSERT_OK(b_->OnDeviceSetLimit({.device = 0, .limit = kLimitMallocHeapSize, .value = 48u << 20}, nullptr));
  ir::DeviceGetLimitRep limit;
  ASSERT_OK(b_->OnDeviceGetLimit({.device = 0, .limit = kLimitMallocHeapSize}, &limit));
  EXPECT_EQ(limit.value, 48u << 20);
  const Status unknown = b_->OnDeviceSetLimit({.device = 0, .limit = 0x77, .value = 1}, nullptr);
  EXPECT_EQ(unknown.code(), Code::kApiError);
  EXPECT_EQ(unknown.api(), Api::kCuda);
  EXPECT_EQ(b_->OnDeviceGetLimit({.device = b_->device_count(), .limit = 0}, &limit).code(), Code::kInvalidArgument);

  ASSERT_OK(b_->OnDeviceSetCacheConfig({.device = 0, .config = 1}, nullptr));  // CU_FUNC_CACHE_PREFER_SHARED
  EXPECT_EQ(b_->OnDeviceSetCacheConfig({.device = 0, .config = 4}, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnFunctionSetCacheConfig({.function = 4242, .config = 0}, nullptr).code(), Code::kUnknownHandle);
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  ASSERT_OK(GetFunction(10, 1, "hello").status());
  ASSERT_OK(b_->OnFunctionSetCacheConfig({.function = 10, .config = 2}, nullptr));  // CU_FUNC_CACHE_PREFER_L1
  EXPECT_EQ(b_->OnFunctionSetCacheConfig({.function = 10, .config = 7}, nullptr).code(), Code::kInvalidArgument);
}

TEST_F(CudaBackendTest, ParamInfoAndLaunchValidation) {
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  auto shapes = GetFunction(10, 1, "shapes");
  ASSERT_OK(shapes.status());
  ASSERT_EQ(shapes->num_params, 5u);
  const uint32_t sizes[] = {1, 8, 16, 40, 8};
  const uint32_t offsets[] = {0, 8, 16, 32, 72};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(shapes->params[i].size, sizes[i]) << i;
    EXPECT_EQ(shapes->params[i].offset, offsets[i]) << i;
    EXPECT_EQ(shapes->params[i].kind, static_cast<uint32_t>(ir::ParamKind::kValue));
  }
  // Unknown kernel: the driver's own code.
  auto missing = GetFunction(11, 1, "no_such_kernel");
  EXPECT_EQ(missing.status().code(), Code::kApiError);
  EXPECT_EQ(missing.status().api(), Api::kCuda);
  EXPECT_EQ(missing.status().native(), kCudaErrorNotFound);
  EXPECT_EQ(GetFunction(11, 99, "shapes").status().code(), Code::kUnknownHandle);
  EXPECT_EQ(GetFunction(10, 1, "shapes").status().code(), Code::kInvalidArgument);  // handle in use

  auto hello = GetFunction(12, 1, "hello");
  ASSERT_OK(hello.status());
  EXPECT_EQ(Launch(12, 1, 1, {}).code(), Code::kInvalidArgument);                           // too few
  EXPECT_EQ(Launch(12, 1, 1, {Bytes(int64_t{1})}).code(), Code::kInvalidArgument);          // wrong size
  EXPECT_EQ(Launch(12, 1, 1, {Bytes(1), Bytes(2)}).code(), Code::kInvalidArgument);         // too many
  EXPECT_EQ(Launch(99, 1, 1, {Bytes(1)}).code(), Code::kUnknownHandle);
  EXPECT_EQ(Launch(12, 1, 1, {Bytes(1)}, 1234).code(), Code::kUnknownHandle);               // stream
  EXPECT_EQ(Launch(12, 1, 1, {Bytes(1)}, 0, {555}).code(), Code::kUnknownHandle);           // event
  EXPECT_EQ(Launch(12, 1ull << 33, 1, {Bytes(1)}).code(), Code::kInvalidArgument);
  ir::LaunchReq dims;
  dims.function = 12;
  dims.dims = 4;
  dims.grid = dims.block = {1, 1, 1, 1};
  EXPECT_EQ(b_->OnLaunch(dims, nullptr).code(), Code::kInvalidArgument);
  dims.dims = 2;
  EXPECT_EQ(b_->OnLaunch(dims, nullptr).code(), Code::kInvalidArgument);
  // A block larger than the device allows: the driver's error, as the native code.
  Status big = Launch(12, 1, 4096, {Bytes(1)});
  EXPECT_EQ(big.code(), Code::kApiError) << big.ToString();
  EXPECT_NE(big.message().find("cuLaunchKernel"), std::string::npos);

  ASSERT_OK(b_->OnFunctionSetAttr({12, kFuncMaxDynamicShared, 1024}, nullptr));
  EXPECT_EQ(b_->OnFunctionSetAttr({12, 9999, 1}, nullptr).code(), Code::kInvalidArgument);
  ir::OccupancyRep occ;
  ASSERT_OK(b_->OnOccupancy({12, 128, 0}, &occ));
  EXPECT_GT(occ.blocks, 0u);
  // Functions outlive their module only as handles to free.
  ASSERT_OK(b_->OnModuleFree({1}, nullptr));
  EXPECT_EQ(Launch(12, 1, 1, {Bytes(1)}).code(), Code::kUnknownHandle);
  ASSERT_OK(b_->OnFunctionFree({12}, nullptr));
  EXPECT_EQ(b_->OnFunctionFree({12}, nullptr).code(), Code::kUnknownHandle);
  // Images that are not CUDA images.
  EXPECT_EQ(b_->OnModuleLoad({2, 0, static_cast<uint32_t>(ir::ModuleKind::kCudaImage), ir::bytes(64, 0x55)}, nullptr).code(),
            Code::kInvalidArgument);
  ir::bytes truncated = *ReadFile(kFatbin);
  truncated.resize(truncated.size() / 2);
  EXPECT_EQ(b_->OnModuleLoad({2, 0, static_cast<uint32_t>(ir::ModuleKind::kCudaImage), truncated}, nullptr).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b_->OnModuleLoad({2, 0, static_cast<uint32_t>(ir::ModuleKind::kOpenCLSource), *ReadFile(kFatbin)}, nullptr).code(),
            Code::kInvalidArgument);
}

TEST_F(CudaBackendTest, ModuleGlobalIsAddressable) {
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  ir::ModuleGlobalRep global;
  ASSERT_OK(b_->OnModuleGlobal({1, "counter"}, &global));
  EXPECT_EQ(global.size, 4u);
  ASSERT_OK(Write(0, global.address, Bytes(int32_t{5})));
  ASSERT_OK(GetFunction(10, 1, "bump").status());
  ASSERT_OK(Launch(10, 4, 32, {Bytes(int32_t{2})}));
  auto v = Read(0, global.address, 4);
  ASSERT_OK(v.status());
  int32_t counter = 0;
  std::memcpy(&counter, v->data(), 4);
  EXPECT_EQ(counter, 5 + 4 * 32 * 2);
  EXPECT_EQ(Read(0, global.address + 2, 4).status().code(), Code::kInvalidArgument);
  Status missing = b_->OnModuleGlobal({1, "no_such_symbol"}, &global);
  EXPECT_EQ(missing.native(), kCudaErrorNotFound) << missing.ToString();
  ASSERT_OK(b_->OnModuleFree({1}, nullptr));
  EXPECT_EQ(Read(0, global.address, 4).status().code(), Code::kInvalidArgument);
}

TEST_F(CudaBackendTest, EventsStreamsAndElapsedTime) {
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  ASSERT_OK(GetFunction(10, 1, "spin").status());
  ASSERT_OK(b_->OnStreamCreate({5, 0, 0, 0}, nullptr));
  ASSERT_OK(b_->OnEventCreate({20, 0, ir::kEventTiming}, nullptr));
  ASSERT_OK(b_->OnEventCreate({21, 0, ir::kEventTiming | ir::kEventBlockingSync}, nullptr));
  ASSERT_OK(b_->OnEventCreate({22, 0, 0}, nullptr));
  ASSERT_OK(b_->OnMarker({5, 0, {}, 20}, nullptr));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(int64_t{20'000'000})}, 5));
  ASSERT_OK(b_->OnMarker({5, 1, {}, 21}, nullptr));
  // The default stream waits for stream 5's end, then signals 22.
  ASSERT_OK(b_->OnMarker({0, 0, {21}, 22}, nullptr));
  ir::EventWaitRep waited;
  ASSERT_OK(b_->OnEventWait({{22, 21}}, &waited));
  EXPECT_EQ(waited.statuses, (ir::i32s{0, 0}));
  ir::EventQueryRep q;
  ASSERT_OK(b_->OnEventQuery({21}, &q));
  EXPECT_EQ(q.status, ir::kEventComplete);
  ir::EventElapsedRep el;
  ASSERT_OK(b_->OnEventElapsed({20, 21}, &el));
  EXPECT_GT(el.ms, 0.5);
  // Events without timing cannot be timed; unknown ones are unknown.
  EXPECT_EQ(b_->OnEventElapsed({20, 22}, &el).code(), Code::kApiError);
  EXPECT_EQ(b_->OnEventElapsed({20, 99}, &el).code(), Code::kUnknownHandle);
  EXPECT_EQ(b_->OnEventCreate({20, 0, 0}, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnEventCreate({23, 0, 0x100}, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->OnStreamCreate({6, 0, ir::kStreamOutOfOrder, 0}, nullptr).code(), Code::kInvalidArgument);
  // Re-recording an event is allowed.
  ASSERT_OK(b_->OnMarker({5, 0, {}, 20}, nullptr));
  ASSERT_OK(b_->OnStreamSync({5}, nullptr));
  ASSERT_OK(b_->OnStreamSync({0}, nullptr));
  ASSERT_OK(b_->OnEventDestroy({22}, nullptr));
  EXPECT_EQ(b_->OnEventQuery({22}, &q).code(), Code::kUnknownHandle);
  ASSERT_OK(b_->OnStreamDestroy({5}, nullptr));
  EXPECT_EQ(b_->OnStreamSync({5}, nullptr).code(), Code::kUnknownHandle);
}

// The two halves of a server-to-server copy (the session's PeerSend / PeerRecv): a bad signal
// fails the command before anything is enqueued (it once left the stream held for good, or a
// pinned block back in the pool under a queued copy), and a receive that fails puts back the
// destination's own bytes rather than the staging's.
TEST_F(CudaBackendTest, PeerHalvesCheckTheirSignalFirstAndAFailedReceiveKeepsTheDestination) {
  Reserve();
  constexpr size_t kN = 256 << 10;
  ASSERT_OK(Alloc(1, kBase, kN));
  ir::bytes a(kN), b(kN);
  for (size_t i = 0; i < kN; ++i) {
    a[i] = static_cast<uint8_t>(i * 7 + 1);
    b[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  ASSERT_OK(Write(1, 0, a));
  ASSERT_OK(b_->OnStreamCreate({5, 0, ir::kStreamNonBlocking, 0}, nullptr));
  ASSERT_OK(b_->OnEventCreate({40, 0, ir::kEventUser}, nullptr));
  for (uint64_t bad : {uint64_t{999}, uint64_t{40}}) {  // unknown; a user event
    bool called = false;
    Status st = b_->ReadToHost(5, 1, 0, kN, {}, bad, [&](Result<std::shared_ptr<HostBuffer>>) { called = true; });
    EXPECT_FALSE(st.ok()) << bad;
    auto w = b_->WriteFromHost(5, 1, 0, kN, {}, bad);
    EXPECT_FALSE(w.ok()) << bad;
    ASSERT_OK(b_->OnStreamSync({5}, nullptr));  // not held: it returns
    EXPECT_FALSE(called);
  }
  // A receive whose transfer fails: the staging holds other bytes, the destination keeps its own.
  ASSERT_OK(b_->OnEventCreate({41, 0, 0}, nullptr));
  auto w = b_->WriteFromHost(5, 1, 0, kN, {}, 41);
  ASSERT_OK(w.status());
  std::memcpy(w->staging->data(), b.data(), kN);
  w->release(Status(Code::kLinkLost, "the source went away"));
  ASSERT_OK(b_->OnStreamSync({5}, nullptr));
  auto back = Read(1, 0, kN);
  ASSERT_OK(back.status());
  EXPECT_TRUE(back.value() == a) << "the failed receive changed its destination";
  // One that succeeds writes the staging's bytes, and the send half reads them back.
  w = b_->WriteFromHost(5, 1, 0, kN, {}, 41);
  ASSERT_OK(w.status());
  std::memcpy(w->staging->data(), b.data(), kN);
  w->release(Status::Ok());
  std::promise<ir::bytes> sent;
  ASSERT_OK(b_->ReadToHost(5, 1, 0, kN, {}, 0, [&](Result<std::shared_ptr<HostBuffer>> r) {
    sent.set_value(r.ok() ? ir::bytes((*r)->data(), (*r)->data() + kN) : ir::bytes{});
  }));
  auto got = sent.get_future();
  ASSERT_EQ(got.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(got.get() == b);
  ir::EventQueryRep q;
  ASSERT_OK(b_->OnEventQuery({41}, &q));
  EXPECT_EQ(q.status, ir::kEventComplete);
}

TEST_F(CudaBackendTest, UserEventHoldsStream) {
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  ASSERT_OK(GetFunction(10, 1, "bump").status());
  ir::ModuleGlobalRep global;
  ASSERT_OK(b_->OnModuleGlobal({1, "counter"}, &global));
  ASSERT_OK(Write(0, global.address, Bytes(int32_t{0})));
  ASSERT_OK(b_->OnStreamCreate({5, 0, ir::kStreamNonBlocking, 0}, nullptr));
  ASSERT_OK(b_->OnEventCreate({30, 0, ir::kEventUser}, nullptr));
  ASSERT_OK(b_->OnEventCreate({31, 0, 0}, nullptr));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(int32_t{1})}, 5, {30}, 31));
  ir::EventQueryRep q;
  ASSERT_OK(b_->OnEventQuery({30}, &q));
  EXPECT_EQ(q.status, ir::kEventSubmitted);
  ASSERT_OK(b_->OnEventQuery({31}, &q));
  EXPECT_EQ(q.status, ir::kEventRunning);  // held behind the user event
  EXPECT_EQ(b_->OnMarker({5, 0, {}, 30}, nullptr).code(), Code::kInvalidArgument);
  // UserEventSet is urgent: the worker's receive thread runs it while the executor waits.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Status st = b_->OnUserEventSet({30, 0}, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
  });
  ir::EventWaitRep w;
  ASSERT_OK(b_->OnEventWait({{30}}, &w));
  setter.join();
  EXPECT_EQ(w.statuses, (ir::i32s{0}));
  EXPECT_EQ(b_->OnUserEventSet({30, 0}, nullptr).code(), Code::kInvalidArgument);
  // Not a user event of the session: unknown, so that a set which overtook its EventCreate
  // (run urgently) goes back in the queue (Session::RunUrgent) and fails there if still so.
  EXPECT_EQ(b_->OnUserEventSet({31, 0}, nullptr).code(), Code::kUnknownHandle);
  ASSERT_OK(b_->OnStreamSync({5}, nullptr));
  ASSERT_OK(b_->OnEventQuery({31}, &q));
  EXPECT_EQ(q.status, ir::kEventComplete);
  auto v = Read(0, global.address, 4);
  ASSERT_OK(v.status());
  EXPECT_EQ((*v)[0], 1);
  // A blocking read on a held stream returns once another thread sets the user event.
  ASSERT_OK(b_->OnEventCreate({33, 0, ir::kEventUser}, nullptr));
  ASSERT_OK(b_->OnMarker({5, 0, {33}, 0}, nullptr));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(int32_t{1})}, 5));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Status st = b_->OnUserEventSet({33, 0}, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
  });
  v = Read(0, global.address, 4, 5);
  releaser.join();
  ASSERT_OK(v.status());
  EXPECT_EQ((*v)[0], 2);
  // A stream still held by an unset user event when the session ends must not hang it.
  ASSERT_OK(b_->OnEventCreate({32, 0, ir::kEventUser}, nullptr));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(int32_t{1})}, 5, {32}));
}

TEST_F(CudaBackendTest, PrintfReachesTakeOutput) {
  REQUIRE_MODULES();
  ASSERT_OK(LoadModule(1, kFatbin));
  ASSERT_OK(GetFunction(10, 1, "hello").status());
  ASSERT_OK(Launch(10, 1, 32, {Bytes(int32_t{42})}));
  ASSERT_OK(Sync());
  std::string text;
  for (const auto& [fd, chunk] : b_->TakeOutput()) {
    EXPECT_EQ(fd, 1u);
    text += chunk;
  }
  EXPECT_NE(text.find("hello from the device 42"), std::string::npos) << "captured: '" << text << "'";
  EXPECT_TRUE(b_->TakeOutput().empty());
}

TEST_F(CudaBackendTest, DynamicParallelismImageLoads) {
  REQUIRE_MODULES();
  const uint64_t g = Reserve();
  ASSERT_OK(LoadModule(1, kDynamicFatbin));
  ASSERT_OK(GetFunction(10, 1, "parent").status());
  ASSERT_OK(Alloc(1, kBase, 32));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(kBase)}));
  auto v = Read(1, 0, 32);
  ASSERT_OK(v.status());
  for (int i = 0; i < 8; ++i) {
    int32_t x;
    std::memcpy(&x, v->data() + 4 * i, 4);
    EXPECT_EQ(x, 100 + i);
  }
  (void)g;
}

TEST_F(CudaBackendTest, StickyErrorPersists) {
  REQUIRE_MODULES();
  const uint64_t g = Reserve();
  ASSERT_OK(LoadModule(1, kFatbin));
  ASSERT_OK(GetFunction(10, 1, "fault").status());
  ASSERT_OK(Alloc(2, kBase + g, 64));
  ASSERT_OK(Launch(10, 1, 1, {Bytes(uint64_t{0x10})}));
  Status st = Sync();
  EXPECT_EQ(st.code(), Code::kApiError);
  EXPECT_EQ(st.native(), kCudaErrorIllegalAddress) << st.ToString();
  // Every later command on the device reports it, even those the driver would let through.
  ir::MemInfoRep mem;
  Status later = b_->OnMemInfo({0}, &mem);
  EXPECT_EQ(later.native(), kCudaErrorIllegalAddress) << later.ToString();
  EXPECT_EQ(Alloc(1, kBase, 64).native(), kCudaErrorIllegalAddress);
  EXPECT_EQ(Read(2, 0, 4).status().native(), kCudaErrorIllegalAddress);
  // DeviceReset frees the session's resources. Where the driver lets the process recover,
  // the device works again with the client's range still reserved; where it does not (driver
  // 580: the error poisons the process, as natively), the reset and all later commands
  // report the error.
  Status reset = b_->OnDeviceReset({0}, nullptr);
  if (!reset.ok()) {
    EXPECT_EQ(reset.native(), kCudaErrorIllegalAddress) << reset.ToString();
    EXPECT_EQ(b_->OnMemInfo({0}, &mem).native(), kCudaErrorIllegalAddress);
    return;
  }
  ASSERT_OK(b_->OnMemInfo({0}, &mem));
  EXPECT_EQ(b_->OnModuleFree({1}, nullptr).code(), Code::kUnknownHandle);
  ASSERT_OK(Alloc(1, kBase, 64));
  ASSERT_OK(Alloc(2, kBase + g, 64));  // mapped before the reset: the address is free again
  ASSERT_OK(Write(1, 0, ir::bytes{9, 8, 7}));
  auto v = Read(1, 0, 3);
  ASSERT_OK(v.status());
  EXPECT_EQ(v.value(), (ir::bytes{9, 8, 7}));
}

// DeviceReset of a healthy device: everything of the session is gone, the range stays.
TEST_F(CudaBackendTest, DeviceResetKeepsReservedRange) {
  const uint64_t g = Reserve();
  ASSERT_OK(Alloc(1, kBase, 64));
  ASSERT_OK(b_->OnStreamCreate({5, 0, 0, 0}, nullptr));
  ASSERT_OK(b_->OnEventCreate({6, 0, ir::kEventUser}, nullptr));
  ASSERT_OK(b_->OnDeviceReset({0}, nullptr));
  EXPECT_EQ(Read(1, 0, 4).status().code(), Code::kUnknownHandle);
  EXPECT_EQ(b_->OnStreamSync({5}, nullptr).code(), Code::kUnknownHandle);
  ir::EventQueryRep q;
  EXPECT_EQ(b_->OnEventQuery({6}, &q).code(), Code::kUnknownHandle);
  ir::AddressReserveRep rep;
  ASSERT_OK(b_->OnAddressReserve({0, kBase, kRange}, &rep));
  EXPECT_EQ(rep.granularity, g);
  ASSERT_OK(Alloc(1, kBase, 64));
  ASSERT_OK(Write(1, 0, ir::bytes{9, 8, 7}));
  auto v = Read(1, 0, 3);
  ASSERT_OK(v.status());
  EXPECT_EQ(v.value(), (ir::bytes{9, 8, 7}));
}

}  // namespace
}  // namespace tandem::server
