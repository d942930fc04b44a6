// The OpenCL front end end to end: each test process starts its own tandemd on 127.0.0.1
// (OpenCL backend over the machine's native platform, PoCL here), points TANDEM_SERVERS and
// OCL_ICD_VENDORS at it and at the built tandem.icd, and uses the API through Debian's
// ocl-icd loader exactly as a program would.
#include <CL/cl.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace {
using namespace tandem_test;

Server* g_server = nullptr;

class Tandem : public ::testing::Test {
 protected:
  // The server is killed at exit, after the client runtime has said goodbye: atexit
  // handlers run in reverse, and this one is registered before the runtime starts.
  static void SetUpTestSuite() {
    g_server = new Server;
    start_error_ = g_server->Start();
    std::atexit([] { g_server->Stop(); });
    if (start_error_.empty()) PointLoaderAtTandem(g_server->address());
    Watchdog::Install([] { return "the server's log:\n" + g_server->log(); }, [] { g_server->Stop(); });
  }

  void SetUp() override {
    ASSERT_TRUE(start_error_.empty()) << start_error_;
    platform_ = TandemPlatform();
    ASSERT_NE(platform_, nullptr) << "the loader does not list the Tandem platform";
    cl_uint n = 0;
    ASSERT_EQ(clGetDeviceIDs(platform_, CL_DEVICE_TYPE_ALL, 1, &device_, &n), CL_SUCCESS) << g_server->log();
    ASSERT_GE(n, 1u);
    cl_int err = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    queue_ = clCreateCommandQueue(context_, device_, 0, &err);
    ASSERT_EQ(err, CL_SUCCESS);
  }
  void TearDown() override {
    if (queue_) clReleaseCommandQueue(queue_);
    if (context_) clReleaseContext(context_);
  }

  cl_mem Buffer(cl_mem_flags flags, size_t size, void* host = nullptr) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(context_, flags, size, host, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return m;
  }
  // Builds source for our device; expects success.
  cl_program Build(const char* src, const char* options = "") {
    cl_int err = CL_SUCCESS;
    cl_program p = clCreateProgramWithSource(context_, 1, &src, nullptr, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    err = clBuildProgram(p, 1, &device_, options, nullptr, nullptr);
    if (err != CL_SUCCESS) {
      size_t n = 0;
      clGetProgramBuildInfo(p, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
      std::string log(n, '\0');
      clGetProgramBuildInfo(p, device_, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
      ADD_FAILURE() << "build failed (" << err << "): " << log;
    }
    return p;
  }
  cl_kernel Kernel(cl_program p, const char* name) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(p, name, &err);
    EXPECT_EQ(err, CL_SUCCESS) << name;
    return k;
  }
  // A user event and a marker on queue_ held by it, flushed: something a thread can wait for
  // until the test sets the event.
  void HeldMarker(cl_event* gate, cl_event* marker) {
    cl_int err = CL_SUCCESS;
    *gate = clCreateUserEvent(context_, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clEnqueueMarkerWithWaitList(queue_, 1, gate, marker), CL_SUCCESS);
    ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  }
  // `inc` over a buffer of n ints, each 5, enqueued behind a user event (not set); the test
  // releases what it gets (GatedInc::Release).
  struct GatedInc {
    cl_program program = nullptr;
    cl_kernel kernel = nullptr;
    cl_mem mem = nullptr;
    cl_event gate = nullptr, run = nullptr;
    void Release() {
      for (cl_event e : {gate, run})
        if (e) clReleaseEvent(e);
      if (mem) clReleaseMemObject(mem);
      if (kernel) clReleaseKernel(kernel);
      if (program) clReleaseProgram(program);
    }
  };
  void GateInc(size_t n, GatedInc* g);
  cl_command_queue ProfilingQueue() {
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(context_, device_, CL_QUEUE_PROFILING_ENABLE, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return q;
  }

  static inline std::string start_error_;
  cl_platform_id platform_ = nullptr;
  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
};

constexpr const char* kSource = R"CLC(
typedef struct { int add; float scale; } params_t;

__kernel void scale_add(__global const float* in, __global float* out, params_t p) {
  size_t i = get_global_id(0);
  out[i] = in[i] * p.scale + p.add;
}

// Sums each work-group's slice through local memory.
__kernel void group_sum(__global const int* in, __global int* out, __local int* scratch) {
  size_t l = get_local_id(0), n = get_local_size(0);
  scratch[l] = in[get_global_id(0)];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t s = n / 2; s > 0; s /= 2) {
    if (l < s) scratch[l] += scratch[l + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (l == 0) out[get_group_id(0)] = scratch[0];
}

// Records each work-item's global id (x + 1000 * y) at its place in the full range.
__kernel void ids(__global int* out, int width) {
  size_t x = get_global_id(0), y = get_global_id(1);
  out[y * width + x] = (int)(x + 1000 * y);
}

__kernel void inc(__global int* data) { data[get_global_id(0)] += 1; }
)CLC";

// ---- platform and devices ------------------------------------------------------------------

TEST_F(Tandem, PlatformAndDevice) {
  char buf[1024];
  ASSERT_EQ(clGetPlatformInfo(platform_, CL_PLATFORM_VERSION, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_STREQ(buf, "OpenCL 1.2 Tandem 0.1");
  ASSERT_EQ(clGetPlatformInfo(platform_, CL_PLATFORM_VENDOR, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_STREQ(buf, "Tandem");

  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_VERSION, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_EQ(std::string(buf).rfind("OpenCL 1.2 ", 0), 0u) << buf;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_OPENCL_C_VERSION, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_LE(std::string(buf).substr(0, 12), std::string("OpenCL C 1.2")) << buf;
  cl_platform_id p = nullptr;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_PLATFORM, sizeof p, &p, nullptr), CL_SUCCESS);
  EXPECT_EQ(p, platform_);
  cl_bool images = CL_TRUE;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, nullptr), CL_SUCCESS);
  EXPECT_EQ(images, CL_FALSE);
  cl_uint refs = 0;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_REFERENCE_COUNT, sizeof refs, &refs, nullptr), CL_SUCCESS);
  EXPECT_EQ(refs, 1u);
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_EXTENSIONS, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_EQ(std::string(buf).find("cl_khr_icd"), std::string::npos);
  EXPECT_EQ(std::string(buf).find("cl_khr_il_program"), std::string::npos);
  EXPECT_EQ(std::string(buf).find("cl_khr_gl_sharing"), std::string::npos);
  // Size rules: too small fails and still reports the size; unknown keys fail.
  size_t need = 0, got = 0;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_NAME, 0, nullptr, &need), CL_SUCCESS);
  EXPECT_GT(need, 1u);
  EXPECT_EQ(clGetDeviceInfo(device_, CL_DEVICE_NAME, need - 1, buf, &got), CL_INVALID_VALUE);
  EXPECT_EQ(got, need);
  EXPECT_EQ(clGetDeviceInfo(device_, 0x7FFF, sizeof buf, buf, nullptr), CL_INVALID_VALUE);
  cl_uint n = 0;
  EXPECT_EQ(clGetDeviceIDs(platform_, CL_DEVICE_TYPE_ALL, 0, nullptr, &n), CL_SUCCESS);
  EXPECT_GE(n, 1u);
  // A context from the device type, with the platform property.
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(platform_), 0};
  cl_int err = CL_SUCCESS;
  cl_context ctx = clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, nullptr, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_context_properties back[3] = {};
  ASSERT_EQ(clGetContextInfo(ctx, CL_CONTEXT_PROPERTIES, sizeof back, back, nullptr), CL_SUCCESS);
  EXPECT_EQ(back[1], props[1]);
  clReleaseContext(ctx);
}

// ---- buffers -----------------------------------------------------------------------------

TEST_F(Tandem, BuffersWriteReadCopyFill) {
  const size_t n = 50000;  // above the inline limit: exercises bulk transfers
  std::vector<int> a(n), b(n, -1);
  std::iota(a.begin(), a.end(), 0);
  cl_mem src = Buffer(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(int), a.data());
  cl_mem dst = Buffer(CL_MEM_READ_WRITE, n * sizeof(int));
  ASSERT_EQ(clEnqueueCopyBuffer(queue_, src, dst, 0, 0, n * sizeof(int), 0, nullptr, nullptr), CL_SUCCESS);
  cl_event read = nullptr;
  ASSERT_EQ(clEnqueueReadBuffer(queue_, dst, CL_FALSE, 0, n * sizeof(int), b.data(), 0, nullptr, &read), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &read), CL_SUCCESS);
  EXPECT_EQ(a, b);  // a read's event completes once the bytes are in host memory
  cl_command_type type = 0;
  ASSERT_EQ(clGetEventInfo(read, CL_EVENT_COMMAND_TYPE, sizeof type, &type, nullptr), CL_SUCCESS);
  EXPECT_EQ(type, static_cast<cl_command_type>(CL_COMMAND_READ_BUFFER));
  clReleaseEvent(read);

  // Fill a range with a pattern, overwrite part of it, read back blocking.
  int pattern = 7;
  ASSERT_EQ(clEnqueueFillBuffer(queue_, dst, &pattern, sizeof pattern, 16, 64 * sizeof(int), 0, nullptr, nullptr),
            CL_SUCCESS);
  int five[2] = {5, 5};
  ASSERT_EQ(clEnqueueWriteBuffer(queue_, dst, CL_TRUE, 20, sizeof five, five, 0, nullptr, nullptr), CL_SUCCESS);
  std::vector<int> got(80);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, dst, CL_TRUE, 0, got.size() * sizeof(int), got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (int i = 0; i < 80; ++i) {
    int want = i < 4 ? i : i < 68 ? 7 : i;
    if (i == 5 || i == 6) want = 5;
    EXPECT_EQ(got[i], want) << i;
  }
  // Argument checks happen on the client.
  EXPECT_EQ(clEnqueueReadBuffer(queue_, dst, CL_TRUE, n * sizeof(int), 4, got.data(), 0, nullptr, nullptr),
            CL_INVALID_VALUE);
  EXPECT_EQ(clEnqueueCopyBuffer(queue_, src, src, 0, 8, 16, 0, nullptr, nullptr), CL_MEM_COPY_OVERLAP);
  EXPECT_EQ(clEnqueueFillBuffer(queue_, dst, &pattern, 3, 0, 12, 0, nullptr, nullptr), CL_INVALID_VALUE);

  // A sub-buffer is a view: writes through it land in the parent.
  cl_buffer_region region{256, 64};
  cl_int err = CL_SUCCESS;
  cl_mem sub = clCreateSubBuffer(dst, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<int> ones(16, 1);
  ASSERT_EQ(clEnqueueWriteBuffer(queue_, sub, CL_FALSE, 0, 64, ones.data(), 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, dst, CL_TRUE, 256, 64, got.data(), 0, nullptr, nullptr), CL_SUCCESS);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got[i], 1);
  size_t offset = 0;
  cl_mem parent = nullptr;
  ASSERT_EQ(clGetMemObjectInfo(sub, CL_MEM_OFFSET, sizeof offset, &offset, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetMemObjectInfo(sub, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, nullptr), CL_SUCCESS);
  EXPECT_EQ(offset, 256u);
  EXPECT_EQ(parent, dst);
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);
  clReleaseMemObject(sub);
  clReleaseMemObject(src);
  clReleaseMemObject(dst);
}

TEST_F(Tandem, MapAndUnmap) {
  const size_t n = 1024;
  std::vector<int> init(n);
  std::iota(init.begin(), init.end(), 100);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, n * sizeof(int), init.data());
  cl_int err = CL_SUCCESS;
  auto* p = static_cast<int*>(clEnqueueMapBuffer(queue_, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 64 * sizeof(int),
                                                 64 * sizeof(int), 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(p[i], 164 + i);
  cl_uint maps = 0;
  ASSERT_EQ(clGetMemObjectInfo(m, CL_MEM_MAP_COUNT, sizeof maps, &maps, nullptr), CL_SUCCESS);
  EXPECT_EQ(maps, 1u);
  for (int i = 0; i < 64; ++i) p[i] = -i;
  ASSERT_EQ(clEnqueueUnmapMemObject(queue_, m, p, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(clEnqueueUnmapMemObject(queue_, m, p, 0, nullptr, nullptr), CL_INVALID_VALUE);

  // Invalidate-map: nothing is read, everything written back.
  auto* w = static_cast<int*>(clEnqueueMapBuffer(queue_, m, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                                 8 * sizeof(int), 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  for (int i = 0; i < 8; ++i) w[i] = 9000 + i;
  cl_event unmapped = nullptr;
  ASSERT_EQ(clEnqueueUnmapMemObject(queue_, m, w, 0, nullptr, &unmapped), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &unmapped), CL_SUCCESS);
  clReleaseEvent(unmapped);
  std::vector<int> got(n);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, n * sizeof(int), got.data(), 0, nullptr, nullptr), CL_SUCCESS);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], 9000 + i);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[64 + i], -i);
  EXPECT_EQ(got[200], 300);

  // USE_HOST_PTR: the map returns the application's memory at the offset, synced.
  std::vector<int> host(n, 3);
  cl_mem u = Buffer(CL_MEM_USE_HOST_PTR, n * sizeof(int), host.data());
  int nine = 9;
  ASSERT_EQ(clEnqueueFillBuffer(queue_, u, &nine, sizeof nine, 0, n * sizeof(int), 0, nullptr, nullptr), CL_SUCCESS);
  cl_event mapped = nullptr;
  auto* hp = static_cast<int*>(clEnqueueMapBuffer(queue_, u, CL_FALSE, CL_MAP_READ, 16 * sizeof(int),
                                                  16 * sizeof(int), 0, nullptr, &mapped, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(hp, host.data() + 16);
  ASSERT_EQ(clWaitForEvents(1, &mapped), CL_SUCCESS);
  EXPECT_EQ(hp[0], 9);
  EXPECT_EQ(hp[15], 9);
  clReleaseEvent(mapped);
  ASSERT_EQ(clEnqueueUnmapMemObject(queue_, u, hp, 0, nullptr, nullptr), CL_SUCCESS);
  void* host_ptr = nullptr;
  ASSERT_EQ(clGetMemObjectInfo(u, CL_MEM_HOST_PTR, sizeof host_ptr, &host_ptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(host_ptr, host.data());
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);

  // No map flags: read and write (the writes once were dropped at the unmap).
  auto* rw = static_cast<int*>(clEnqueueMapBuffer(queue_, m, CL_TRUE, 0, 0, 4 * sizeof(int), 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(rw[0], 9000);
  rw[0] = 99;
  ASSERT_EQ(clEnqueueUnmapMemObject(queue_, m, rw, 0, nullptr, nullptr), CL_SUCCESS);
  int first = 0;
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, sizeof first, &first, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(first, 99);

  // A blocking invalidate-map returns only once what the queue held before it is done: here a
  // non-blocking read, whose bytes must then be in host memory (it once returned at once).
  std::vector<int> early(n, 0);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_FALSE, 0, n * sizeof(int), early.data(), 0, nullptr, nullptr), CL_SUCCESS);
  auto* inv = static_cast<int*>(clEnqueueMapBuffer(queue_, u, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                                   sizeof(int), 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(early[0], 99);
  EXPECT_EQ(early[64], 0);  // -0, written by the first map
  EXPECT_EQ(early[200], 300);
  ASSERT_EQ(clEnqueueUnmapMemObject(queue_, u, inv, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);
  clReleaseMemObject(u);
  clReleaseMemObject(m);
}

TEST_F(Tandem, RectangularTransfers) {
  // A 16x8x2 byte box; move a 5x3x2 region between different origins and pitches.
  const size_t row = 16, slice = 16 * 8, total = slice * 2;
  std::vector<uint8_t> host(total);
  for (size_t i = 0; i < total; ++i) host[i] = static_cast<uint8_t>(i);
  cl_mem m = Buffer(CL_MEM_READ_WRITE, total);
  cl_mem copy = Buffer(CL_MEM_READ_WRITE, total);
  std::vector<uint8_t> zero(total, 0);
  ASSERT_EQ(clEnqueueWriteBuffer(queue_, m, CL_TRUE, 0, total, zero.data(), 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueWriteBuffer(queue_, copy, CL_TRUE, 0, total, zero.data(), 0, nullptr, nullptr), CL_SUCCESS);
  size_t buf_origin[3] = {3, 2, 0}, host_origin[3] = {1, 1, 0}, region[3] = {5, 3, 2};
  ASSERT_EQ(clEnqueueWriteBufferRect(queue_, m, CL_TRUE, buf_origin, host_origin, region, row, slice, row, slice,
                                     host.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<uint8_t> whole(total);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, total, whole.data(), 0, nullptr, nullptr), CL_SUCCESS);
  for (size_t z = 0; z < 2; ++z)
    for (size_t y = 0; y < 8; ++y)
      for (size_t x = 0; x < 16; ++x) {
        bool inside = x >= 3 && x < 8 && y >= 2 && y < 5;
        uint8_t want = inside ? host[z * slice + (y - 1) * row + (x - 2)] : 0;
        ASSERT_EQ(whole[z * slice + y * row + x], want) << x << "," << y << "," << z;
      }
  // Copy the box elsewhere on the device, then read a rectangle back to a tight layout.
  size_t dst_origin[3] = {8, 4, 0};
  ASSERT_EQ(clEnqueueCopyBufferRect(queue_, m, copy, buf_origin, dst_origin, region, row, slice, row, slice, 0,
                                    nullptr, nullptr),
            CL_SUCCESS);
  std::vector<uint8_t> tight(5 * 3 * 2, 0xEE);
  size_t zero_origin[3] = {0, 0, 0};
  cl_event ev = nullptr;
  ASSERT_EQ(clEnqueueReadBufferRect(queue_, copy, CL_FALSE, dst_origin, zero_origin, region, row, slice, 0, 0,
                                    tight.data(), 0, nullptr, &ev),
            CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &ev), CL_SUCCESS);
  clReleaseEvent(ev);
  for (size_t z = 0; z < 2; ++z)
    for (size_t y = 0; y < 3; ++y)
      for (size_t x = 0; x < 5; ++x)
        EXPECT_EQ(tight[z * 15 + y * 5 + x], host[z * slice + (y + 1) * row + (x + 1)]) << x << "," << y << "," << z;
  // Within one buffer: the even rows of 8 bytes onto the odd ones (row pitch 16, x origin 8).
  // The byte ranges interleave without a shared byte: no overlap, by the specification's test.
  size_t even[3] = {0, 0, 0}, odd[3] = {8, 0, 0}, rows[3] = {8, 8, 2};
  ASSERT_EQ(clEnqueueCopyBufferRect(queue_, m, m, even, odd, rows, row, slice, row, slice, 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, total, whole.data(), 0, nullptr, nullptr), CL_SUCCESS);
  for (size_t i = 0; i < total; i += row)
    for (size_t x = 0; x < 8; ++x) ASSERT_EQ(whole[i + 8 + x], whole[i + x]) << i << "," << x;
  // Shifted by one byte, they share bytes.
  size_t shifted[3] = {1, 0, 0}, narrow[3] = {8, 2, 1};
  EXPECT_EQ(clEnqueueCopyBufferRect(queue_, m, m, even, shifted, narrow, row, slice, row, slice, 0, nullptr, nullptr),
            CL_MEM_COPY_OVERLAP);
  size_t bad_region[3] = {17, 1, 1};
  EXPECT_EQ(clEnqueueReadBufferRect(queue_, m, CL_TRUE, zero_origin, zero_origin, bad_region, row, 0, 0, 0,
                                    tight.data(), 0, nullptr, nullptr),
            CL_INVALID_VALUE);
  clReleaseMemObject(copy);
  clReleaseMemObject(m);
}

// ---- programs ----------------------------------------------------------------------------

TEST_F(Tandem, BuildFailureKeepsTheLog) {
  const char* bad = "__kernel void broken(__global int* x) { x[0] = undefined_name; }";
  cl_int err = CL_SUCCESS;
  cl_program p = clCreateProgramWithSource(context_, 1, &bad, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(clBuildProgram(p, 0, nullptr, "", nullptr, nullptr), CL_BUILD_PROGRAM_FAILURE);
  cl_build_status status = CL_BUILD_NONE;
  ASSERT_EQ(clGetProgramBuildInfo(p, device_, CL_PROGRAM_BUILD_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_EQ(status, CL_BUILD_ERROR);
  size_t n = 0;
  ASSERT_EQ(clGetProgramBuildInfo(p, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n), CL_SUCCESS);
  std::string log(n, '\0');
  ASSERT_EQ(clGetProgramBuildInfo(p, device_, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr), CL_SUCCESS);
  EXPECT_NE(log.find("undefined_name"), std::string::npos) << log;
  clCreateKernel(p, "broken", &err);
  EXPECT_EQ(err, CL_INVALID_PROGRAM_EXECUTABLE);
  clReleaseProgram(p);
}

TEST_F(Tandem, BinaryRoundTrip) {
  cl_program p = Build(kSource);
  size_t size = 0;
  ASSERT_EQ(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr), CL_SUCCESS);
  ASSERT_GT(size, 0u);
  std::vector<unsigned char> binary(size);
  unsigned char* ptrs[1] = {binary.data()};
  ASSERT_EQ(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof ptrs, ptrs, nullptr), CL_SUCCESS);
  size_t kernels = 0;
  ASSERT_EQ(clGetProgramInfo(p, CL_PROGRAM_NUM_KERNELS, sizeof kernels, &kernels, nullptr), CL_SUCCESS);
  EXPECT_EQ(kernels, 4u);

  const unsigned char* bins[1] = {binary.data()};
  cl_int status = -1, err = CL_SUCCESS;
  cl_program q = clCreateProgramWithBinary(context_, 1, &device_, &size, bins, &status, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(status, CL_SUCCESS);
  ASSERT_EQ(clBuildProgram(q, 1, &device_, "", nullptr, nullptr), CL_SUCCESS);
  cl_kernel k = Kernel(q, "inc");
  std::vector<int> data(256, 41);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, data.size() * sizeof(int), data.data());
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  size_t global = data.size();
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, data.size() * sizeof(int), data.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (int v : data) ASSERT_EQ(v, 42);
  cl_program_binary_type bt = 0;
  ASSERT_EQ(clGetProgramBuildInfo(q, device_, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, nullptr), CL_SUCCESS);
  EXPECT_EQ(bt, static_cast<cl_program_binary_type>(CL_PROGRAM_BINARY_TYPE_EXECUTABLE));
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(q);
  clReleaseProgram(p);
}

// ---- kernels -----------------------------------------------------------------------------

TEST_F(Tandem, KernelsWithStructAndLocalArguments) {
  cl_program p = Build(kSource, "-cl-kernel-arg-info");
  cl_int err = CL_SUCCESS;
  clCreateKernel(p, "no_such_kernel", &err);
  EXPECT_EQ(err, CL_INVALID_KERNEL_NAME);
  cl_uint count = 0;
  ASSERT_EQ(clCreateKernelsInProgram(p, 0, nullptr, &count), CL_SUCCESS);
  EXPECT_EQ(count, 4u);

  // A struct passed by value.
  struct Params {
    cl_int add;
    cl_float scale;
  } params{10, 2.0f};
  const size_t n = 512;
  std::vector<float> in(n), out(n);
  std::iota(in.begin(), in.end(), 0.0f);
  cl_mem bin = Buffer(CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), in.data());
  cl_mem bout = Buffer(CL_MEM_WRITE_ONLY, n * sizeof(float));
  cl_kernel k = Kernel(p, "scale_add");
  cl_uint nargs = 0;
  ASSERT_EQ(clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, nullptr), CL_SUCCESS);
  EXPECT_EQ(nargs, 3u);
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof bin, &bin), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 1, sizeof bout, &bout), CL_SUCCESS);
  size_t global = n;
  EXPECT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
            CL_INVALID_KERNEL_ARGS);
  EXPECT_EQ(clSetKernelArg(k, 0, sizeof bin - 1, &bin), CL_INVALID_ARG_SIZE);
  ASSERT_EQ(clSetKernelArg(k, 2, sizeof params, &params), CL_SUCCESS);
  EXPECT_EQ(clSetKernelArg(k, 3, sizeof params, &params), CL_INVALID_ARG_INDEX);
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, bout, CL_TRUE, 0, n * sizeof(float), out.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (size_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(out[i], in[i] * 2.0f + 10.0f);
  char name[64];
  ASSERT_EQ(clGetKernelArgInfo(k, 2, CL_KERNEL_ARG_TYPE_NAME, sizeof name, name, nullptr), CL_SUCCESS);
  EXPECT_STREQ(name, "params_t");
  cl_kernel_arg_address_qualifier aq = 0;
  ASSERT_EQ(clGetKernelArgInfo(k, 0, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof aq, &aq, nullptr), CL_SUCCESS);
  EXPECT_EQ(aq, static_cast<cl_kernel_arg_address_qualifier>(CL_KERNEL_ARG_ADDRESS_GLOBAL));
  // The device's qualifiers: `__global const float* in` is const, `out` has none; a buffer's
  // access qualifier is NONE (they once all answered NONE whatever the source said).
  cl_kernel_arg_type_qualifier tq = 99;
  ASSERT_EQ(clGetKernelArgInfo(k, 0, CL_KERNEL_ARG_TYPE_QUALIFIER, sizeof tq, &tq, nullptr), CL_SUCCESS);
  EXPECT_EQ(tq, static_cast<cl_kernel_arg_type_qualifier>(CL_KERNEL_ARG_TYPE_CONST));
  ASSERT_EQ(clGetKernelArgInfo(k, 1, CL_KERNEL_ARG_TYPE_QUALIFIER, sizeof tq, &tq, nullptr), CL_SUCCESS);
  EXPECT_EQ(tq, static_cast<cl_kernel_arg_type_qualifier>(CL_KERNEL_ARG_TYPE_NONE));
  cl_kernel_arg_access_qualifier acc = 0;
  ASSERT_EQ(clGetKernelArgInfo(k, 0, CL_KERNEL_ARG_ACCESS_QUALIFIER, sizeof acc, &acc, nullptr), CL_SUCCESS);
  EXPECT_EQ(acc, static_cast<cl_kernel_arg_access_qualifier>(CL_KERNEL_ARG_ACCESS_NONE));

  // __local scratch memory: per-group sums.
  const size_t items = 1024, group = 64;
  std::vector<int> values(items);
  std::iota(values.begin(), values.end(), 1);
  cl_mem vin = Buffer(CL_MEM_COPY_HOST_PTR, items * sizeof(int), values.data());
  cl_mem sums = Buffer(CL_MEM_READ_WRITE, items / group * sizeof(int));
  cl_kernel g = Kernel(p, "group_sum");
  ASSERT_EQ(clSetKernelArg(g, 0, sizeof vin, &vin), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(g, 1, sizeof sums, &sums), CL_SUCCESS);
  EXPECT_EQ(clSetKernelArg(g, 2, group * sizeof(int), values.data()), CL_INVALID_ARG_VALUE);
  ASSERT_EQ(clSetKernelArg(g, 2, group * sizeof(int), nullptr), CL_SUCCESS);
  size_t wg = 0;
  ASSERT_EQ(clGetKernelWorkGroupInfo(g, device_, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, nullptr), CL_SUCCESS);
  ASSERT_GE(wg, group);
  cl_ulong local = 0;
  ASSERT_EQ(clGetKernelWorkGroupInfo(g, device_, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local, nullptr), CL_SUCCESS);
  EXPECT_GE(local, group * sizeof(int));
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, g, 1, nullptr, &items, &group, 0, nullptr, nullptr), CL_SUCCESS);
  std::vector<int> got(items / group);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, sums, CL_TRUE, 0, got.size() * sizeof(int), got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (size_t i = 0; i < got.size(); ++i) {
    int first = static_cast<int>(i * group) + 1;
    EXPECT_EQ(got[i], static_cast<int>(group) * first + static_cast<int>(group * (group - 1) / 2)) << i;
  }
  for (cl_mem m : {bin, bout, vin, sums}) clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseKernel(g);
  clReleaseProgram(p);
}

TEST_F(Tandem, NDRangeWithOffsetAndChecks) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "ids");
  const int width = 32, height = 16;
  std::vector<int> init(width * height, -1);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, init.size() * sizeof(int), init.data());
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  // An int parameter given a long: refused here, as natively (it once passed, and the launch
  // then failed with nothing but a log line).
  const long wide = width;
  EXPECT_EQ(clSetKernelArg(k, 1, sizeof wide, &wide), CL_INVALID_ARG_SIZE);
  ASSERT_EQ(clSetKernelArg(k, 1, sizeof width, &width), CL_SUCCESS);
  size_t offset[2] = {8, 4}, global[2] = {16, 8}, local[2] = {4, 4};
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 2, offset, global, local, 0, nullptr, nullptr), CL_SUCCESS);
  std::vector<int> got(init.size());
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, got.size() * sizeof(int), got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      bool inside = x >= 8 && x < 24 && y >= 4 && y < 12;
      ASSERT_EQ(got[y * width + x], inside ? x + 1000 * y : -1) << x << "," << y;
    }
  size_t bad_local[2] = {3, 4};
  EXPECT_EQ(clEnqueueNDRangeKernel(queue_, k, 2, nullptr, global, bad_local, 0, nullptr, nullptr),
            CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_EQ(clEnqueueNDRangeKernel(queue_, k, 0, nullptr, global, nullptr, 0, nullptr, nullptr),
            CL_INVALID_WORK_DIMENSION);
  EXPECT_EQ(clEnqueueNDRangeKernel(queue_, k, 4, nullptr, global, nullptr, 0, nullptr, nullptr),
            CL_INVALID_WORK_DIMENSION);
  // A task is a 1x1x1 range.
  cl_kernel inc = Kernel(p, "inc");
  ASSERT_EQ(clSetKernelArg(inc, 0, sizeof m, &m), CL_SUCCESS);
  ASSERT_EQ(clEnqueueTask(queue_, inc, 0, nullptr, nullptr), CL_SUCCESS);
  int first = 0;
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, sizeof first, &first, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(first, 0);  // -1 + 1
  clReleaseKernel(inc);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

// A kernel that fails on the server with no event asked for (local memory beyond the device's:
// the server refuses the launch): its queue's next clFinish or blocking read says so, once;
// another queue of the same server is not told; a command that did not run because an event
// it waited on failed is left to the events, as natively (PoCL's clFinish answers CL_SUCCESS).
TEST_F(Tandem, FailureWithoutAnEventIsReportedByItsQueuesNextFinishOrBlockingRead) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "group_sum");
  std::vector<int> in(64, 1);
  cl_mem bin = Buffer(CL_MEM_COPY_HOST_PTR, in.size() * sizeof(int), in.data());
  cl_mem bout = Buffer(CL_MEM_READ_WRITE, 4 * sizeof(int));
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof bin, &bin), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 1, sizeof bout, &bout), CL_SUCCESS);
  cl_ulong device_local = 0;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_LOCAL_MEM_SIZE, sizeof device_local, &device_local, nullptr), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 2, device_local * 64, nullptr), CL_SUCCESS);
  size_t global = 64, local = 16;
  cl_int err = CL_SUCCESS;
  cl_command_queue other = clCreateCommandQueue(context_, device_, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  // clFinish, once; the other queue is not told.
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, &local, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(clFinish(other), CL_SUCCESS);
  EXPECT_EQ(clFinish(queue_), CL_OUT_OF_RESOURCES);
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  // A blocking read, once.
  std::vector<int> sums(4);
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, &local, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(clEnqueueReadBuffer(queue_, bout, CL_TRUE, 0, sums.size() * sizeof(int), sums.data(), 0, nullptr, nullptr),
            CL_OUT_OF_RESOURCES);
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  // A kernel behind a user event the program fails does not run, and only the events say so.
  ASSERT_EQ(clSetKernelArg(k, 2, local * sizeof(int), nullptr), CL_SUCCESS);
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, &local, 1, &gate, nullptr), CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(gate, -42), CL_SUCCESS);
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  clReleaseEvent(gate);
  // The same kernel within bounds runs, and finishes clean.
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, &local, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, bout, CL_TRUE, 0, sums.size() * sizeof(int), sums.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(sums, (std::vector<int>{16, 16, 16, 16}));
  clReleaseCommandQueue(other);
  clReleaseMemObject(bin);
  clReleaseMemObject(bout);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

// A sub-buffer that starts inside its buffer, as a kernel argument, on an in-order and an
// out-of-order queue: only its range changes.
TEST_F(Tandem, SubBufferKernelArguments) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "inc");
  std::vector<int> data(1024, 10);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, data.size() * sizeof(int), data.data());
  cl_buffer_region region{256 * sizeof(int), 128 * sizeof(int)};
  cl_int err = CL_SUCCESS;
  cl_mem sub = clCreateSubBuffer(m, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof sub, &sub), CL_SUCCESS);
  size_t global = 128;
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  cl_command_queue ooo = clCreateCommandQueue(context_, device_, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);
  cl_event done = nullptr;
  ASSERT_EQ(clEnqueueNDRangeKernel(ooo, k, 1, nullptr, &global, nullptr, 0, nullptr, &done), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &done), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, data.size() * sizeof(int), data.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(data[i], i >= 256 && i < 384 ? 12 : 10) << i;
  clReleaseEvent(done);
  clReleaseCommandQueue(ooo);
  clReleaseMemObject(sub);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

// ---- events ----------------------------------------------------------------------------

TEST_F(Tandem, EventsMarkersAndProfiling) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "inc");
  std::vector<int> data(4096, 0);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, data.size() * sizeof(int), data.data());
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  cl_command_queue pq = ProfilingQueue();
  size_t global = data.size();
  cl_event run = nullptr, marker = nullptr, barrier = nullptr;
  ASSERT_EQ(clEnqueueNDRangeKernel(pq, k, 1, nullptr, &global, nullptr, 0, nullptr, &run), CL_SUCCESS);
  ASSERT_EQ(clEnqueueMarkerWithWaitList(pq, 1, &run, &marker), CL_SUCCESS);
  ASSERT_EQ(clEnqueueBarrierWithWaitList(pq, 0, nullptr, &barrier), CL_SUCCESS);
  ASSERT_EQ(clFlush(pq), CL_SUCCESS);
  cl_event all[] = {run, marker, barrier};
  ASSERT_EQ(clWaitForEvents(3, all), CL_SUCCESS);
  cl_int status = -1;
  ASSERT_EQ(clGetEventInfo(run, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_EQ(status, CL_COMPLETE);
  cl_ulong t[4] = {};
  const cl_profiling_info keys[4] = {CL_PROFILING_COMMAND_QUEUED, CL_PROFILING_COMMAND_SUBMIT,
                                     CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END};
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(clGetEventProfilingInfo(run, keys[i], sizeof t[i], &t[i], nullptr), CL_SUCCESS);
  EXPECT_LE(t[0], t[1]);
  EXPECT_LE(t[1], t[2]);
  EXPECT_LE(t[2], t[3]);
  EXPECT_GT(t[3], 0u);
  cl_command_queue eq = nullptr;
  ASSERT_EQ(clGetEventInfo(run, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, nullptr), CL_SUCCESS);
  EXPECT_EQ(eq, pq);

  // Without CL_QUEUE_PROFILING_ENABLE there is nothing to report.
  cl_event plain = nullptr;
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, &plain), CL_SUCCESS);
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);
  EXPECT_EQ(clGetEventProfilingInfo(plain, CL_PROFILING_COMMAND_END, sizeof t[0], &t[0], nullptr),
            CL_PROFILING_INFO_NOT_AVAILABLE);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, sizeof(int), data.data(), 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(data[0], 2);
  for (cl_event e : {run, marker, barrier, plain}) clReleaseEvent(e);
  clReleaseCommandQueue(pq);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

struct CallbackLog {
  std::mutex mu;
  std::vector<std::pair<cl_event, cl_int>> calls;
  std::thread::id thread;
};

void CL_CALLBACK Record(cl_event e, cl_int status, void* data) {
  auto* log = static_cast<CallbackLog*>(data);
  std::lock_guard lock(log->mu);
  log->calls.emplace_back(e, status);
  log->thread = std::this_thread::get_id();
}

TEST_F(Tandem, UserEventsAndCallbacks) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "inc");
  std::vector<int> data(64, 5);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, data.size() * sizeof(int), data.data());
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_int status = -1;
  ASSERT_EQ(clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_EQ(status, CL_SUBMITTED);

  // The kernel waits for the user event; its callback must not run before the gate opens.
  size_t global = data.size();
  cl_event run = nullptr;
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 1, &gate, &run), CL_SUCCESS);
  CallbackLog log;
  ASSERT_EQ(clSetEventCallback(run, CL_COMPLETE, Record, &log), CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard lock(log.mu);
    EXPECT_TRUE(log.calls.empty());
  }
  ASSERT_EQ(clGetEventInfo(run, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_GT(status, CL_COMPLETE);
  ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  EXPECT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_INVALID_OPERATION);
  ASSERT_EQ(clWaitForEvents(1, &run), CL_SUCCESS);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard lock(log.mu);
      if (!log.calls.empty() || std::chrono::steady_clock::now() > deadline) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    std::lock_guard lock(log.mu);
    ASSERT_EQ(log.calls.size(), 1u);
    EXPECT_EQ(log.calls[0].first, run);
    EXPECT_EQ(log.calls[0].second, CL_COMPLETE);
    EXPECT_NE(log.thread, std::this_thread::get_id());
  }
  // On an event already complete, the callback still runs on the library's thread.
  CallbackLog late;
  ASSERT_EQ(clSetEventCallback(run, CL_COMPLETE, Record, &late), CL_SUCCESS);
  // Sleep without the lock: the callback needs it to record its call.
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard lock(late.mu);
      if (!late.calls.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    std::lock_guard lock(late.mu);
    EXPECT_EQ(late.calls.size(), 1u);
  }
  EXPECT_EQ(clSetEventCallback(run, 42, Record, &late), CL_INVALID_VALUE);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, data.size() * sizeof(int), data.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(data[0], 6);

  // A failed user event fails the commands that wait for it.
  cl_event fail = clCreateUserEvent(context_, &err);
  cl_event after = nullptr;
  ASSERT_EQ(clEnqueueMarkerWithWaitList(queue_, 1, &fail, &after), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(fail, -1234), CL_SUCCESS);
  EXPECT_EQ(clWaitForEvents(1, &fail), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  ASSERT_EQ(clGetEventInfo(fail, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_EQ(status, -1234);
  clWaitForEvents(1, &after);
  for (cl_event e : {gate, run, fail, after}) clReleaseEvent(e);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

// ---- user events and the server's session -----------------------------------------------------
// tandemd runs a session's commands in order: a command that waits for a user event there
// would hold every later one, the program's query, or the callback that sets the event,
// among them. None of these may wait natively, so none may wait through Tandem.

// A large non-blocking read (bulk, by RMA) queued behind a kernel gated on a user event, then
// a query: answered while the gate is shut, and the read lands once it opens, with what the
// gated kernel wrote and not what the kernel after it writes. tandemd once read a bulk
// transfer's chunks on the session's executor with blocking reads: the read waited there for
// the gate, and the query behind it, which the program needs answered before it opens the
// gate, never was (the bytes now pass through host memory off the executor).
void Tandem::GateInc(size_t n, GatedInc* g) {
  g->program = Build(kSource);
  g->kernel = Kernel(g->program, "inc");
  std::vector<int> data(n, 5);
  g->mem = Buffer(CL_MEM_COPY_HOST_PTR, n * sizeof(int), data.data());
  ASSERT_EQ(clSetKernelArg(g->kernel, 0, sizeof g->mem, &g->mem), CL_SUCCESS);
  cl_int err = CL_SUCCESS;
  g->gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, g->kernel, 1, nullptr, &n, nullptr, 1, &g->gate, &g->run), CL_SUCCESS);
}

TEST_F(Tandem, ALargeReadBehindAUserEventHoldsNoQuery) {
  const size_t n = 1u << 18;  // 1 MiB: well above the inline limit
  GatedInc g;
  ASSERT_NO_FATAL_FAILURE(GateInc(n, &g));
  std::vector<int> back(n, 0), after(n, 0);
  cl_event read = nullptr;
  ASSERT_EQ(clEnqueueReadBuffer(queue_, g.mem, CL_FALSE, 0, n * sizeof(int), back.data(), 0, nullptr, &read),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, g.kernel, 1, nullptr, &n, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  cl_int status = CL_COMPLETE;
  ASSERT_EQ(clGetEventInfo(g.run, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_GT(status, CL_COMPLETE);
  ASSERT_EQ(clGetEventInfo(read, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_GT(status, CL_COMPLETE);
  EXPECT_EQ(back[0], 0);  // nothing has landed while the gate is shut
  ASSERT_EQ(clSetUserEventStatus(g.gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &read), CL_SUCCESS);
  EXPECT_EQ(back[0], 6);
  EXPECT_EQ(back[n - 1], 6);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, g.mem, CL_TRUE, 0, n * sizeof(int), after.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(after[0], 7);
  EXPECT_EQ(after[n - 1], 7);
  clReleaseEvent(read);
  g.Release();
}

// Many large reads behind the gate, more than tandemd once had threads for (64: each such
// read's reply holds one until its device copy ends), then a blocking read on another queue
// before the gate opens: answered at once, as natively; then every read lands.
TEST_F(Tandem, ManyLargeReadsBehindAUserEventHoldNoOtherRead) {
  const size_t n = 1u << 18;  // 1 MiB each
  constexpr int kReads = 72;
  GatedInc g;
  ASSERT_NO_FATAL_FAILURE(GateInc(n, &g));
  std::vector<std::vector<int>> backs(kReads, std::vector<int>(n, 0));
  std::vector<cl_event> reads(kReads, nullptr);
  for (int i = 0; i < kReads; ++i)
    ASSERT_EQ(clEnqueueReadBuffer(queue_, g.mem, CL_FALSE, 0, n * sizeof(int), backs[i].data(), 0, nullptr, &reads[i]),
              CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  cl_int err = CL_SUCCESS;
  cl_command_queue other = clCreateCommandQueue(context_, device_, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<int> small(16, 3), small_back(16, 0);
  cl_mem s = Buffer(CL_MEM_COPY_HOST_PTR, small.size() * sizeof(int), small.data());
  EXPECT_EQ(clEnqueueReadBuffer(other, s, CL_TRUE, 0, small.size() * sizeof(int), small_back.data(), 0, nullptr, nullptr),
            CL_SUCCESS);  // no ASSERT: the gate must open below
  EXPECT_EQ(small_back, small);
  ASSERT_EQ(clSetUserEventStatus(g.gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(kReads, reads.data()), CL_SUCCESS);
  for (int i = 0; i < kReads; ++i) {
    EXPECT_EQ(backs[i][0], 6) << "read " << i;
    EXPECT_EQ(backs[i][n - 1], 6) << "read " << i;
    clReleaseEvent(reads[i]);
  }
  clReleaseMemObject(s);
  clReleaseCommandQueue(other);
  g.Release();
}

// What follows a large read on its queue completes only once the read's bytes are in the
// program's memory: a marker after it, polled from when the gate opens, never says CL_COMPLETE
// before the last byte has landed (the read's device copy ends well before its bytes do).
TEST_F(Tandem, WhatFollowsALargeReadCompletesAfterItsBytesLand) {
  const size_t n = 1u << 21;  // 8 MiB
  GatedInc g;
  ASSERT_NO_FATAL_FAILURE(GateInc(n, &g));
  std::vector<int> back(n, 0);
  cl_event read = nullptr, after = nullptr;
  ASSERT_EQ(clEnqueueReadBuffer(queue_, g.mem, CL_FALSE, 0, n * sizeof(int), back.data(), 0, nullptr, &read),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &after), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(g.gate, CL_COMPLETE), CL_SUCCESS);
  cl_int status = CL_QUEUED;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       status != CL_COMPLETE && std::chrono::steady_clock::now() < until;)
    ASSERT_EQ(clGetEventInfo(after, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  ASSERT_EQ(status, CL_COMPLETE);
  EXPECT_EQ(back[n - 1], 6);
  EXPECT_EQ(back[0], 6);
  ASSERT_EQ(clWaitForEvents(1, &read), CL_SUCCESS);
  for (cl_event e : {read, after}) clReleaseEvent(e);
  g.Release();
}

// The same for a large non-blocking write: queued behind the gated kernel, it neither holds
// the query nor lands before the kernel has run (the kernel's increment is overwritten).
TEST_F(Tandem, ALargeWriteBehindAUserEventHoldsNoQuery) {
  const size_t n = 1u << 18;
  GatedInc g;
  ASSERT_NO_FATAL_FAILURE(GateInc(n, &g));
  std::vector<int> fresh(n, 40), back(n, 0);
  cl_event write = nullptr;
  ASSERT_EQ(clEnqueueWriteBuffer(queue_, g.mem, CL_FALSE, 0, n * sizeof(int), fresh.data(), 0, nullptr, &write),
            CL_SUCCESS);
  cl_int status = CL_COMPLETE;
  ASSERT_EQ(clGetEventInfo(write, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr), CL_SUCCESS);
  EXPECT_GT(status, CL_COMPLETE);
  ASSERT_EQ(clSetUserEventStatus(g.gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &write), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, g.mem, CL_TRUE, 0, n * sizeof(int), back.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(back[0], 40);
  EXPECT_EQ(back[n - 1], 40);
  clReleaseEvent(write);
  g.Release();
}

// A thread waits for a kernel gated on a user event that a callback of an earlier kernel sets:
// the callback runs (it needs the server to say the earlier kernel is done) and the wait ends.
TEST_F(Tandem, AWaitForAnEventGatedByACallbackEnds) {
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "inc");
  std::vector<int> data(64, 5);
  cl_mem m = Buffer(CL_MEM_COPY_HOST_PTR, data.size() * sizeof(int), data.data());
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const size_t global = data.size();
  cl_event first = nullptr, second = nullptr;
  ASSERT_EQ(clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, nullptr, 0, nullptr, &first), CL_SUCCESS);
  cl_command_queue other = clCreateCommandQueue(context_, device_, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clEnqueueMarkerWithWaitList(other, 1, &gate, &second), CL_SUCCESS);
  ASSERT_EQ(clFlush(other), CL_SUCCESS);
  ASSERT_EQ(clSetEventCallback(
                first, CL_COMPLETE, [](cl_event, cl_int, void* g) { clSetUserEventStatus(static_cast<cl_event>(g), CL_COMPLETE); },
                gate),
            CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  EXPECT_EQ(clWaitForEvents(1, &second), CL_SUCCESS);
  for (cl_event e : {gate, first, second}) clReleaseEvent(e);
  clReleaseCommandQueue(other);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

// One thread waits for a command gated on a user event; another fails the event: the wait
// ends with the wait list's error, as natively.
TEST_F(Tandem, FailingAUserEventEndsAnotherThreadsWait) {
  cl_event gate = nullptr, marker = nullptr;
  ASSERT_NO_FATAL_FAILURE(HeldMarker(&gate, &marker));
  cl_int waited = CL_SUCCESS;
  std::thread waiter([&] { waited = clWaitForEvents(1, &marker); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(clSetUserEventStatus(gate, -7), CL_SUCCESS);  // no ASSERT: the thread must be joined
  waiter.join();
  EXPECT_EQ(waited, CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  clReleaseEvent(marker);
  clReleaseEvent(gate);
}

// One thread waits for a command held by a user event that another thread sets only once its
// own clFinish and blocking read have returned: neither may queue behind that wait (tandemd
// once ran deferred replies one after another).
TEST_F(Tandem, AThreadsFinishIsNotHeldBehindAnotherThreadsUserEventWait) {
  cl_event gate = nullptr, marker = nullptr;
  ASSERT_NO_FATAL_FAILURE(HeldMarker(&gate, &marker));
  cl_int err = CL_SUCCESS;
  cl_int waited = CL_INVALID_VALUE;
  cl_command_queue other = clCreateCommandQueue(context_, device_, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem b = Buffer(CL_MEM_READ_WRITE, 64);
  // No ASSERT from here to the join: the waiting thread must be joined.
  std::thread waiter([&] { waited = clWaitForEvents(1, &marker); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its wait is on the server
  const int seven = 7;
  EXPECT_EQ(clEnqueueFillBuffer(other, b, &seven, sizeof seven, 0, 64, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(clFinish(other), CL_SUCCESS);
  int back = 0;
  EXPECT_EQ(clEnqueueReadBuffer(other, b, CL_TRUE, 0, sizeof back, &back, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(back, 7);
  EXPECT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  waiter.join();
  EXPECT_EQ(waited, CL_SUCCESS);
  clReleaseMemObject(b);
  clReleaseCommandQueue(other);
  clReleaseEvent(marker);
  clReleaseEvent(gate);
}

// ---- reference counts ----------------------------------------------------------------------

void CL_CALLBACK CountDestructor(cl_mem, void* data) { static_cast<std::atomic<int>*>(data)->fetch_add(1); }

template <class T, class Info>
cl_uint RefCount(T obj, cl_int (*get)(T, Info, size_t, void*, size_t*), Info key) {
  cl_uint n = 0;
  EXPECT_EQ(get(obj, key, sizeof n, &n, nullptr), CL_SUCCESS);
  return n;
}

// A buffer released while a command that uses it is still queued: the object goes, and its
// destructor callback runs, only once that command is done (a callback may free the memory a
// transfer still lands in; it once ran at the release), and not later than that.
TEST_F(Tandem, DestructorCallbackWaitsForQueuedCommands) {
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem b = Buffer(CL_MEM_READ_WRITE, 64);
  const int seven = 7;
  ASSERT_EQ(clEnqueueFillBuffer(queue_, b, &seven, sizeof seven, 0, 64, 1, &gate, nullptr), CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  std::atomic<int> fired{0};
  ASSERT_EQ(clSetMemObjectDestructorCallback(
                b, [](cl_mem, void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }, &fired),
            CL_SUCCESS);
  ASSERT_EQ(clReleaseMemObject(b), CL_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(fired.load(), 0) << "the callback ran while the fill was still held";
  // A command enqueued after the release, held until the program has seen the callback: the
  // callback waits only for what the queue held at the release (waiting for the whole queue
  // would never end here).
  cl_event later = clCreateUserEvent(context_, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clEnqueueMarkerWithWaitList(queue_, 1, &later, nullptr), CL_SUCCESS);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  for (int i = 0; i < 500 && fired.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(fired.load(), 1);
  ASSERT_EQ(clSetUserEventStatus(later, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clFinish(queue_), CL_SUCCESS);
  clReleaseEvent(later);
  clReleaseEvent(gate);
}

// ---- one thread's wait holds nothing else of the program's -------------------------------
// A single-threaded program's clFinish may be waited for on the server's executor, as CUDA's
// synchronize is (kRecordCallerWaits); then nothing else of the session runs there until it
// returns. These two programs must not get that: their other thread, or callback, has to run
// meanwhile, as natively.

constexpr const char* kSpinSource = R"CLC(
__kernel void spin(__global float* out, int n) {
  float x = out[0];
  for (int i = 0; i < n; ++i) x = x * 0.999999f + 1.0f;
  out[0] = x;
}
)CLC";

class TandemSpin : public Tandem {
 protected:
  void SetUp() override {
    Tandem::SetUp();
    if (HasFatalFailure()) return;
    program_ = Build(kSpinSource);
    kernel_ = Kernel(program_, "spin");
    out_ = Buffer(CL_MEM_READ_WRITE, sizeof(float));
    const float zero = 0;
    ASSERT_EQ(clEnqueueWriteBuffer(queue_, out_, CL_TRUE, 0, sizeof zero, &zero, 0, nullptr, nullptr), CL_SUCCESS);
    Spin(1);  // the first launch may compile the kernel: not timed
    // A single work-item's loop that takes a quarter of a second or more on this device.
    for (int n = 1 << 20;; n *= 2) {
      n_ = n;
      spin_s_ = Spin(n);
      if (spin_s_ >= 0.25 || n >= (1 << 30)) break;
    }
    ASSERT_GE(spin_s_, 0.1) << "no loop of up to 2^30 steps took long enough here";
  }
  void TearDown() override {
    if (out_) clReleaseMemObject(out_);
    if (kernel_) clReleaseKernel(kernel_);
    if (program_) clReleaseProgram(program_);
    Tandem::TearDown();
  }
  // Enqueues the loop of n steps on queue_ (event: its event, or nullptr).
  void EnqueueSpin(int n, cl_event* event = nullptr) {
    ASSERT_EQ(clSetKernelArg(kernel_, 0, sizeof out_, &out_), CL_SUCCESS);
    ASSERT_EQ(clSetKernelArg(kernel_, 1, sizeof n, &n), CL_SUCCESS);
    const size_t one = 1;
    ASSERT_EQ(clEnqueueNDRangeKernel(queue_, kernel_, 1, nullptr, &one, &one, 0, nullptr, event), CL_SUCCESS);
  }
  // Seconds for the loop of n steps and a clFinish.
  double Spin(int n) {
    const auto t0 = std::chrono::steady_clock::now();
    EnqueueSpin(n);
    EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
    return Seconds(t0);
  }
  static double Seconds(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  }

  cl_program program_ = nullptr;
  cl_kernel kernel_ = nullptr;
  cl_mem out_ = nullptr;
  int n_ = 0;
  double spin_s_ = 0;
};

// While one thread waits in clFinish for a long kernel, another thread's call that the server
// answers at once (a program's binary) is answered at once.
TEST_F(TandemSpin, OneThreadsFinishDoesNotHoldAnotherThreadsCalls) {
  std::atomic<bool> ready{false}, waiting{false};
  double other_s = -1;
  std::chrono::steady_clock::time_point other_end;
  std::thread other([&] {
    cl_program p = Build(kSpinSource);  // this thread's first commands: before the wait below
    ready = true;
    while (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::duration<double>(spin_s_ / 4));
    const auto t0 = std::chrono::steady_clock::now();
    size_t size = 0;
    EXPECT_EQ(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr), CL_SUCCESS);
    other_s = Seconds(t0);
    other_end = std::chrono::steady_clock::now();
    EXPECT_GT(size, 0u);
    clReleaseProgram(p);
  });
  while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EnqueueSpin(n_);
  ASSERT_EQ(clFlush(queue_), CL_SUCCESS);
  waiting = true;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  const double finish_s = Seconds(t0);
  const auto finish_end = std::chrono::steady_clock::now();
  other.join();
  // The loop ran while the other thread called (or the check below would pass vacuously).
  // Held behind the wait, the call would be answered after it, so it would end when or after
  // clFinish returns; answered at once, it ends well before. Compared as moments, not as a
  // duration: on a loaded 2-core machine the kernel's spinning threads can slow the call
  // itself (0.28 s in a CI run) without holding it.
  EXPECT_GT(finish_s, 0.6 * spin_s_);
  EXPECT_LT(std::chrono::duration<double>(other_end - finish_end).count(), -0.1 * spin_s_)
      << "the other thread's call took " << other_s << " s and ended "
      << std::chrono::duration<double>(finish_end - other_end).count() << " s before clFinish returned (clFinish took "
      << finish_s << " s; the loop alone: " << spin_s_ << " s)";
}

// A callback on a short kernel queued before a long one fires when the short one is done,
// not when the program's clFinish of both returns.
TEST_F(TandemSpin, ACallbackIsNotHeldByTheProgramsFinish) {
  struct Fired {
    std::atomic<bool> done{false};
    std::chrono::steady_clock::time_point at;
  } fired;
  cl_event short_one = nullptr;
  EnqueueSpin(1, &short_one);
  ASSERT_EQ(clSetEventCallback(
                short_one, CL_COMPLETE,
                [](cl_event, cl_int, void* p) {
                  auto* f = static_cast<Fired*>(p);
                  f->at = std::chrono::steady_clock::now();
                  f->done = true;
                },
                &fired),
            CL_SUCCESS);
  EnqueueSpin(n_);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  const double finish_s = Seconds(t0);
  for (int i = 0; i < 500 && !fired.done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fired.done);
  const double fired_s = std::chrono::duration<double>(fired.at - t0).count();
  EXPECT_GT(finish_s, 0.6 * spin_s_);  // the long loop was still running when clFinish began
  // Held by the clFinish, it would fire when or after that returned; not held, well before
  // (a moment's comparison: load may slow the callback without holding it).
  EXPECT_LT(fired_s, finish_s - 0.1 * spin_s_) << "the callback fired " << fired_s << " s into a clFinish of "
                                               << finish_s << " s (the loop alone: " << spin_s_ << " s)";
  clReleaseEvent(short_one);
}

// clFinish waits for the commands enqueued before it, not for one another thread enqueues
// after it, held by a user event that this thread sets once its clFinish has returned. Its
// wait starts late here: tandemd's waiter is busy with a third thread's clFinish of a long
// kernel (a late clFinish on the server once waited for that held command, for ever).
TEST_F(TandemSpin, AFinishWaitsOnlyForWhatCameBeforeIt) {
  cl_int err = CL_SUCCESS;
  cl_command_queue other = clCreateCommandQueue(context_, device_, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::atomic<bool> spinning{false};
  // No ASSERT from here to the joins: both threads must be joined.
  std::thread longer([&] {
    EnqueueSpin(n_);
    EXPECT_EQ(clFlush(queue_), CL_SUCCESS);
    spinning = true;
    EXPECT_EQ(clFinish(queue_), CL_SUCCESS);
  });
  while (!spinning) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::duration<double>(spin_s_ / 8));  // its clFinish is on the server
  cl_event gate = nullptr;
  std::chrono::steady_clock::time_point gated_at;
  std::thread gater([&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(spin_s_ / 4));  // after the clFinish below
    cl_int e = CL_SUCCESS;
    gate = clCreateUserEvent(context_, &e);
    EXPECT_EQ(e, CL_SUCCESS);
    EXPECT_EQ(clEnqueueMarkerWithWaitList(other, 1, &gate, nullptr), CL_SUCCESS);
    EXPECT_EQ(clFlush(other), CL_SUCCESS);
    gated_at = std::chrono::steady_clock::now();
  });
  EXPECT_EQ(clFinish(other), CL_SUCCESS);
  const auto finished_at = std::chrono::steady_clock::now();
  gater.join();
  EXPECT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  longer.join();
  EXPECT_EQ(clFinish(other), CL_SUCCESS);
  clReleaseEvent(gate);
  clReleaseCommandQueue(other);
  // A loaded machine may run the held command's thread only once the long kernel is done:
  // the wait had ended before it, and the test shows nothing.
  if (gated_at >= finished_at) GTEST_SKIP() << "the long kernel ended before the held command was enqueued";
}

TEST_F(Tandem, ReferenceCounts) {
  EXPECT_EQ(RefCount(context_, clGetContextInfo, cl_context_info{CL_CONTEXT_REFERENCE_COUNT}), 1u);
  ASSERT_EQ(clRetainContext(context_), CL_SUCCESS);
  EXPECT_EQ(RefCount(context_, clGetContextInfo, cl_context_info{CL_CONTEXT_REFERENCE_COUNT}), 2u);
  ASSERT_EQ(clReleaseContext(context_), CL_SUCCESS);

  // A buffer released by the application lives on while its sub-buffer holds it.
  std::vector<int> init(256);
  std::iota(init.begin(), init.end(), 0);
  cl_mem parent = Buffer(CL_MEM_COPY_HOST_PTR, init.size() * sizeof(int), init.data());
  std::atomic<int> destroyed{0};
  ASSERT_EQ(clSetMemObjectDestructorCallback(parent, CountDestructor, &destroyed), CL_SUCCESS);
  ASSERT_EQ(clRetainMemObject(parent), CL_SUCCESS);
  EXPECT_EQ(RefCount(parent, clGetMemObjectInfo, cl_mem_info{CL_MEM_REFERENCE_COUNT}), 2u);
  ASSERT_EQ(clReleaseMemObject(parent), CL_SUCCESS);
  cl_buffer_region region{128, 128};
  cl_int err = CL_SUCCESS;
  cl_mem sub = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clReleaseMemObject(parent), CL_SUCCESS);
  std::vector<int> got(32);
  ASSERT_EQ(clEnqueueReadBuffer(queue_, sub, CL_TRUE, 0, 128, got.data(), 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_EQ(got[0], 32);
  EXPECT_EQ(destroyed.load(), 0);
  ASSERT_EQ(clReleaseMemObject(sub), CL_SUCCESS);
  for (int i = 0; i < 1000 && destroyed.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(destroyed.load(), 1);

  // A program stays while its kernels do; a kernel reports its own count.
  cl_program p = Build(kSource);
  cl_kernel k = Kernel(p, "inc");
  EXPECT_EQ(RefCount(p, clGetProgramInfo, cl_program_info{CL_PROGRAM_REFERENCE_COUNT}), 1u);
  ASSERT_EQ(clRetainKernel(k), CL_SUCCESS);
  EXPECT_EQ(RefCount(k, clGetKernelInfo, cl_kernel_info{CL_KERNEL_REFERENCE_COUNT}), 2u);
  ASSERT_EQ(clReleaseKernel(k), CL_SUCCESS);
  // Rebuilding while a kernel is attached is refused.
  EXPECT_EQ(clBuildProgram(p, 0, nullptr, "", nullptr, nullptr), CL_INVALID_OPERATION);
  ASSERT_EQ(clReleaseProgram(p), CL_SUCCESS);
  cl_program owner = nullptr;
  ASSERT_EQ(clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof owner, &owner, nullptr), CL_SUCCESS);
  EXPECT_EQ(owner, p);
  ASSERT_EQ(clReleaseKernel(k), CL_SUCCESS);

  cl_event user = clCreateUserEvent(context_, &err);
  ASSERT_EQ(clRetainEvent(user), CL_SUCCESS);
  EXPECT_EQ(RefCount(user, clGetEventInfo, cl_event_info{CL_EVENT_REFERENCE_COUNT}), 2u);
  ASSERT_EQ(clReleaseEvent(user), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(user, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clReleaseEvent(user), CL_SUCCESS);
  EXPECT_EQ(RefCount(queue_, clGetCommandQueueInfo, cl_command_queue_info{CL_QUEUE_REFERENCE_COUNT}), 1u);
}

// ---- no server ---------------------------------------------------------------------------

// TANDEM_SERVERS names a port nobody listens on: the platform is there with no devices.
TEST(TandemWithoutServer, PlatformHasNoDevices) {
  if (g_loader_pointed) GTEST_SKIP() << "needs a process of its own (ctest runs each test alone)";
  PointLoaderAtTandem("127.0.0.1:" + std::to_string(FreePort()));
  setenv("TANDEM_CONNECT_TIMEOUT_MS", "1000", 1);
  cl_platform_id p = TandemPlatform();
  ASSERT_NE(p, nullptr);
  cl_uint n = 5;
  EXPECT_EQ(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n), CL_DEVICE_NOT_FOUND);
  EXPECT_EQ(n, 0u);
}

}  // namespace
