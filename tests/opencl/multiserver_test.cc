// One OpenCL context over the devices of two tandemd servers on 127.0.0.1: a queue per
// device, buffers used by both, kept coherent by server-to-server copies (or, with
// TANDEM_VDMA=0, relayed through the client: ctest runs this binary both ways).
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <string>
#include <vector>

#include "harness.h"

namespace {
using namespace tandem_test;

Server* g_servers = nullptr;  // two

constexpr const char* kSource = R"CLC(
__kernel void inc(__global int* data) { data[get_global_id(0)] += 1; }
__kernel void scale(__global const int* in, __global int* out, int k) {
  size_t i = get_global_id(0);
  out[i] = in[i] * k;
}
)CLC";

class MultiServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_servers = new Server[2];
    for (int i = 0; i < 2 && start_error_.empty(); ++i) start_error_ = g_servers[i].Start();
    std::atexit([] {
      g_servers[0].Stop();
      g_servers[1].Stop();
    });
    // The first device of each server (a GPU machine's servers also list PoCL's CPU device).
    if (start_error_.empty()) PointLoaderAtTandem(g_servers[0].address() + "/0," + g_servers[1].address() + "/0");
    Watchdog::Install(
        [] { return "first server's log:\n" + g_servers[0].log() + "second server's log:\n" + g_servers[1].log(); },
        [] {
          g_servers[0].Stop();
          g_servers[1].Stop();
        });
  }

  void SetUp() override {
    ASSERT_TRUE(start_error_.empty()) << start_error_;
    cl_platform_id platform = TandemPlatform();
    ASSERT_NE(platform, nullptr);
    cl_uint n = 0;
    ASSERT_EQ(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 2, devices_, &n), CL_SUCCESS);
    ASSERT_EQ(n, 2u) << "one device per server";
    cl_int err = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 2, devices_, nullptr, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    for (int i = 0; i < 2; ++i) {
      queues_[i] = clCreateCommandQueue(context_, devices_[i], 0, &err);
      ASSERT_EQ(err, CL_SUCCESS) << "a queue on the device of server " << i;
    }
    const char* source = kSource;
    program_ = clCreateProgramWithSource(context_, 1, &source, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clBuildProgram(program_, 2, devices_, "", nullptr, nullptr), CL_SUCCESS);
  }
  void TearDown() override {
    if (program_) clReleaseProgram(program_);
    for (cl_command_queue q : queues_)
      if (q) clReleaseCommandQueue(q);
    if (context_) clReleaseContext(context_);
  }

  cl_mem Buffer(size_t bytes, void* host = nullptr, cl_mem_flags flags = CL_MEM_READ_WRITE) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(context_, flags | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes, host, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return m;
  }
  cl_kernel Kernel(const char* name) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(program_, name, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return k;
  }
  std::vector<int> ReadAll(int queue, cl_mem m, size_t count) {
    std::vector<int> out(count, -1);
    EXPECT_EQ(clEnqueueReadBuffer(queues_[queue], m, CL_TRUE, 0, count * sizeof(int), out.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    return out;
  }

  // A buffer of `count` zeros, current only on queue q's server.
  cl_mem ZerosOn(int q, size_t count) {
    std::vector<int> zeros(count, 0);
    cl_mem m = Buffer(count * sizeof(int));
    EXPECT_EQ(clEnqueueMigrateMemObjects(queues_[q], 1, &m, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, nullptr,
                                         nullptr),
              CL_SUCCESS);
    EXPECT_EQ(clEnqueueWriteBuffer(queues_[q], m, CL_TRUE, 0, count * sizeof(int), zeros.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    return m;
  }

  static inline std::string start_error_;
  cl_device_id devices_[2] = {};
  cl_context context_ = nullptr;
  cl_command_queue queues_[2] = {};
  cl_program program_ = nullptr;
};

TEST_F(MultiServer, DevicesOfBothServersInOneContext) {
  char a[256] = {}, b[256] = {};
  ASSERT_EQ(clGetDeviceInfo(devices_[0], CL_DEVICE_NAME, sizeof a, a, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetDeviceInfo(devices_[1], CL_DEVICE_NAME, sizeof b, b, nullptr), CL_SUCCESS);
  EXPECT_NE(devices_[0], devices_[1]);
  EXPECT_STREQ(a, b);  // the same PoCL device behind both servers
}

// A buffer alternately incremented by kernels on the two servers: each kernel must see the
// other server's last result, and a read on either queue the latest bytes.
TEST_F(MultiServer, KernelsOnBothServersShareABuffer) {
  constexpr size_t kCount = 4096;
  std::vector<int> init(kCount);
  std::iota(init.begin(), init.end(), 0);
  cl_mem m = Buffer(kCount * sizeof(int), init.data());
  cl_kernel inc = Kernel("inc");
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof m, &m), CL_SUCCESS);
  constexpr int kRounds = 6;
  for (int r = 0; r < kRounds; ++r) {
    const int q = r % 2;
    ASSERT_EQ(clEnqueueNDRangeKernel(queues_[q], inc, 1, nullptr, &kCount, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
    ASSERT_EQ(clFinish(queues_[q]), CL_SUCCESS);
  }
  for (int q = 0; q < 2; ++q) {
    std::vector<int> got = ReadAll(q, m, kCount);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], static_cast<int>(i) + kRounds) << "queue " << q << " at " << i;
  }
  clReleaseKernel(inc);
  clReleaseMemObject(m);
}

// clEnqueueCopyBuffer between buffers current on different servers: only the range moves,
// the rest of the destination keeps its bytes.
TEST_F(MultiServer, CopyBufferRangeBetweenServers) {
  constexpr size_t kCount = 1 << 18;  // 1 MiB of ints: large enough for bulk paths
  std::vector<int> a(kCount), b(kCount);
  for (size_t i = 0; i < kCount; ++i) a[i] = static_cast<int>(i * 3 + 1), b[i] = -static_cast<int>(i);
  cl_mem src = Buffer(kCount * sizeof(int));
  cl_mem dst = Buffer(kCount * sizeof(int));
  ASSERT_EQ(clEnqueueWriteBuffer(queues_[0], src, CL_TRUE, 0, kCount * sizeof(int), a.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueWriteBuffer(queues_[1], dst, CL_TRUE, 0, kCount * sizeof(int), b.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  const size_t from = 1000, to = 5000, count = 100000;
  cl_event done = nullptr;
  ASSERT_EQ(clEnqueueCopyBuffer(queues_[1], src, dst, from * sizeof(int), to * sizeof(int), count * sizeof(int), 0,
                                nullptr, &done),
            CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &done), CL_SUCCESS);
  cl_int status = 0;
  ASSERT_EQ(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_EQ(status, CL_COMPLETE);
  clReleaseEvent(done);
  std::vector<int> want = b;
  std::copy(a.begin() + from, a.begin() + from + count, want.begin() + to);
  EXPECT_EQ(ReadAll(1, dst, kCount), want);
  EXPECT_EQ(ReadAll(0, dst, kCount), want);  // and back on the first server
  EXPECT_EQ(ReadAll(1, src, kCount), a);
  clReleaseMemObject(src);
  clReleaseMemObject(dst);
}

// Explicit migration, then a kernel on the second server reading a read-only input that
// stays current on both.
TEST_F(MultiServer, MigrateThenComputeOnTheOtherServer) {
  constexpr size_t kCount = 50000;
  std::vector<int> in(kCount);
  std::iota(in.begin(), in.end(), 7);
  cl_mem input = Buffer(kCount * sizeof(int), in.data(), CL_MEM_READ_ONLY);
  cl_mem output = Buffer(kCount * sizeof(int));
  ASSERT_EQ(clEnqueueMigrateMemObjects(queues_[1], 1, &input, 0, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueMigrateMemObjects(queues_[1], 1, &output, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, nullptr,
                                       nullptr),
            CL_SUCCESS);
  cl_kernel k = Kernel("scale");
  for (int q = 1; q >= 0; --q) {
    const int factor = 3 + q;
    ASSERT_EQ(clSetKernelArg(k, 0, sizeof input, &input), CL_SUCCESS);
    ASSERT_EQ(clSetKernelArg(k, 1, sizeof output, &output), CL_SUCCESS);
    ASSERT_EQ(clSetKernelArg(k, 2, sizeof factor, &factor), CL_SUCCESS);
    ASSERT_EQ(clEnqueueNDRangeKernel(queues_[q], k, 1, nullptr, &kCount, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
    std::vector<int> got = ReadAll(1 - q, output, kCount);  // read on the other server
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], in[i] * factor) << "factor " << factor << " at " << i;
  }
  clReleaseKernel(k);
  clReleaseMemObject(input);
  clReleaseMemObject(output);
}

// A partial write on the second server to a buffer current on the first keeps the rest.
TEST_F(MultiServer, PartialWriteKeepsTheOtherServersBytes) {
  constexpr size_t kCount = 30000;
  std::vector<int> init(kCount, 5);
  cl_mem m = Buffer(kCount * sizeof(int), init.data());
  std::vector<int> patch(100, 9);
  ASSERT_EQ(clEnqueueWriteBuffer(queues_[1], m, CL_TRUE, 200 * sizeof(int), patch.size() * sizeof(int), patch.data(), 0,
                                 nullptr, nullptr),
            CL_SUCCESS);
  std::vector<int> want = init;
  std::fill(want.begin() + 200, want.begin() + 300, 9);
  EXPECT_EQ(ReadAll(0, m, kCount), want);
  const int pattern = 2;
  ASSERT_EQ(clEnqueueFillBuffer(queues_[1], m, &pattern, sizeof pattern, 0, 16 * sizeof(int), 0, nullptr, nullptr),
            CL_SUCCESS);
  std::fill(want.begin(), want.begin() + 16, 2);
  EXPECT_EQ(ReadAll(0, m, kCount), want);
  clReleaseMemObject(m);
}

// The relayed variant (TANDEM_VDMA=0) waits for another server's events in the client, so a
// wait list that names one blocks the enqueue until the event completes.
bool DirectLinks() {
  const char* v = std::getenv("TANDEM_VDMA");
  return !(v && std::string(v) == "0");
}

cl_int Status(cl_event e) {
  cl_int status = 1;
  EXPECT_EQ(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  return status;
}

// A kernel on the second server waits for a kernel of the first that is itself held by a user
// event: the enqueue returns at once (the wait is the servers' business, not the client's),
// the second kernel does not run before the first, and both run once the user event is set.
TEST_F(MultiServer, WaitListEventOfAnotherServerIsWaitedForThere) {
  if (!DirectLinks()) GTEST_SKIP() << "with TANDEM_VDMA=0 the client itself waits for the event";
  constexpr size_t kCount = 1024;
  std::vector<int> zeros(kCount, 0);
  cl_mem a = Buffer(kCount * sizeof(int), zeros.data());  // used on the first server only
  cl_mem b = ZerosOn(1, kCount);
  ASSERT_EQ(ReadAll(0, a, kCount), zeros);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel inc = Kernel("inc");
  cl_event first = nullptr, second = nullptr, third = nullptr;
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof a, &a), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[0], inc, 1, nullptr, &kCount, nullptr, 1, &gate, &first), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[0]), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof b, &b), CL_SUCCESS);
  // Waits on the first server's kernel, then (third) directly on the user event, which lives
  // on the context's first server too.
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[1], inc, 1, nullptr, &kCount, nullptr, 1, &first, &second), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[1], inc, 1, nullptr, &kCount, nullptr, 1, &gate, &third), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[1]), CL_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(Status(first), CL_COMPLETE);
  EXPECT_NE(Status(second), CL_COMPLETE) << "ran before the other server's event completed";
  EXPECT_NE(Status(third), CL_COMPLETE) << "ran before the user event was set";
  ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  cl_event all[] = {first, second, third};
  ASSERT_EQ(clWaitForEvents(3, all), CL_SUCCESS);
  EXPECT_EQ(Status(second), CL_COMPLETE);
  EXPECT_EQ(ReadAll(0, a, kCount), std::vector<int>(kCount, 1));
  EXPECT_EQ(ReadAll(1, b, kCount), std::vector<int>(kCount, 2));
  for (cl_event e : all) clReleaseEvent(e);
  clReleaseEvent(gate);
  clReleaseKernel(inc);
  clReleaseMemObject(a);
  clReleaseMemObject(b);
}

// A copy out of a server waits for the writes there that overlap the range it copies, and for
// no other: a copy that the program did not order after a pending write of other bytes runs
// at once (the 4-device advection's halo copies out of a band that is still receiving its own
// halos chained the servers one after another), and a copy ordered after a write of its range
// through another queue's marker gets the written bytes.
TEST_F(MultiServer, CopyOutWaitsOnlyForWritesOfItsRange) {
  constexpr size_t kCount = 4096;
  std::vector<int> init(kCount);
  std::iota(init.begin(), init.end(), 0);
  cl_mem m = Buffer(kCount * sizeof(int), init.data());  // current on the first server
  ASSERT_EQ(ReadAll(0, m, kCount), init);
  cl_mem dst = ZerosOn(1, kCount);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const int seven = 7;
  cl_event fill = nullptr;
  ASSERT_EQ(clEnqueueFillBuffer(queues_[0], m, &seven, sizeof seven, 0, 100 * sizeof(int), 1, &gate, &fill),
            CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[0]), CL_SUCCESS);

  cl_event other = nullptr;
  ASSERT_EQ(clEnqueueCopyBuffer(queues_[1], m, dst, 1000 * sizeof(int), 0, 1000 * sizeof(int), 0, nullptr, &other),
            CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[1]), CL_SUCCESS);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Status(other) != CL_COMPLETE && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(Status(other), CL_COMPLETE) << "a copy of bytes 1000-1999 waited for a write of bytes 0-99";

  cl_event overlapping = nullptr;
  if (DirectLinks()) {  // relayed, the enqueue itself would wait for the gate
    cl_event after_fill = nullptr;
    ASSERT_EQ(clEnqueueMarkerWithWaitList(queues_[1], 1, &fill, &after_fill), CL_SUCCESS);
    ASSERT_EQ(clEnqueueCopyBuffer(queues_[1], m, dst, 50 * sizeof(int), 2000 * sizeof(int), 100 * sizeof(int), 0,
                                  nullptr, &overlapping),
              CL_SUCCESS);
    ASSERT_EQ(clFlush(queues_[1]), CL_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_NE(Status(overlapping), CL_COMPLETE) << "ran before the write it is ordered after";
    clReleaseEvent(after_fill);
  }
  ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &fill), CL_SUCCESS);
  std::vector<int> want(kCount, 0);
  std::iota(want.begin(), want.begin() + 1000, 1000);
  if (overlapping) {
    ASSERT_EQ(clWaitForEvents(1, &overlapping), CL_SUCCESS);
    std::fill(want.begin() + 2000, want.begin() + 2050, 7);
    std::iota(want.begin() + 2050, want.begin() + 2100, 100);
    clReleaseEvent(overlapping);
  }
  EXPECT_EQ(ReadAll(1, dst, kCount), want);
  std::vector<int> filled = init;
  std::fill(filled.begin(), filled.begin() + 100, 7);
  EXPECT_EQ(ReadAll(1, m, kCount), filled);
  clReleaseEvent(other);
  clReleaseEvent(fill);
  clReleaseEvent(gate);
  clReleaseMemObject(m);
  clReleaseMemObject(dst);
}

// A failure crosses servers as it does within one: the command that waits on another
// server's failed event does not run, and its event reports the failure.
TEST_F(MultiServer, FailedEventOfAnotherServerFailsItsWaiters) {
  if (!DirectLinks()) GTEST_SKIP() << "with TANDEM_VDMA=0 the client itself waits for the event";
  constexpr size_t kCount = 256;
  std::vector<int> zeros(kCount, 0);
  cl_mem b = ZerosOn(1, kCount);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem a = Buffer(kCount * sizeof(int), zeros.data());  // used on the first server only
  ASSERT_EQ(ReadAll(0, a, kCount), zeros);
  cl_event marker = nullptr, after = nullptr;
  cl_kernel inc = Kernel("inc");
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof a, &a), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[0], inc, 1, nullptr, &kCount, nullptr, 1, &gate, &marker), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[0]), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof b, &b), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[1], inc, 1, nullptr, &kCount, nullptr, 1, &marker, &after), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[1]), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(gate, -42), CL_SUCCESS);
  EXPECT_EQ(clWaitForEvents(1, &after), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  EXPECT_LT(Status(marker), 0);
  EXPECT_LT(Status(after), 0) << "the kernel ran although what it waited for failed";
  clReleaseEvent(after);
  clReleaseEvent(marker);
  clReleaseEvent(gate);
  clReleaseKernel(inc);
  clReleaseMemObject(a);
  clReleaseMemObject(b);
}

// A copy between servers whose source failed (it waits for a failed event) fails too, with
// the failure in its own event, and both servers go on serving: the next copy and kernels on
// each work.
TEST_F(MultiServer, CopyWhoseSourceFailedFailsAndBothServersGoOn) {
  if (!DirectLinks()) GTEST_SKIP() << "with TANDEM_VDMA=0 the client relays the copy itself";
  constexpr size_t kCount = 256;
  cl_mem a = ZerosOn(0, kCount);
  cl_mem b = ZerosOn(1, kCount);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event marker = nullptr, copied = nullptr;
  cl_kernel inc = Kernel("inc");
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof a, &a), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[0], inc, 1, nullptr, &kCount, nullptr, 1, &gate, &marker), CL_SUCCESS);
  ASSERT_EQ(clEnqueueCopyBuffer(queues_[1], a, b, 0, 0, kCount * sizeof(int), 1, &marker, &copied), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[0]), CL_SUCCESS);
  ASSERT_EQ(clFlush(queues_[1]), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(gate, -42), CL_SUCCESS);
  EXPECT_EQ(clWaitForEvents(1, &copied), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  EXPECT_LT(Status(copied), 0) << "the copy of a source that failed succeeded";
  clReleaseEvent(copied);
  clReleaseEvent(marker);
  clReleaseEvent(gate);

  // Both servers still serve: a fresh copy across them, then a kernel on each.
  std::vector<int> ones(kCount, 1);
  cl_mem c = ZerosOn(0, kCount);
  ASSERT_EQ(clEnqueueWriteBuffer(queues_[0], c, CL_TRUE, 0, kCount * sizeof(int), ones.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  cl_mem d = ZerosOn(1, kCount);
  ASSERT_EQ(clEnqueueCopyBuffer(queues_[1], c, d, 0, 0, kCount * sizeof(int), 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof d, &d), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[1], inc, 1, nullptr, &kCount, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(ReadAll(1, d, kCount), std::vector<int>(kCount, 2));
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof c, &c), CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queues_[0], inc, 1, nullptr, &kCount, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(ReadAll(0, c, kCount), std::vector<int>(kCount, 2));
  clReleaseKernel(inc);
  for (cl_mem m : {a, b, c, d}) clReleaseMemObject(m);
}

}  // namespace
