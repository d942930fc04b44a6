// The OpenCL front end without servers: the dispatch table is complete, the library exports
// exactly the ICD's three symbols, unsupported entries fail cleanly, and info queries follow
// the spec's size rules. Links the front end's objects, so no ICD loader is involved; the
// built .so is checked through dlopen and nm.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "objects.h"

namespace {

using tandem::ocl::kDispatch;
using tandem::ocl::ThePlatform;

TEST(DispatchTable, EverySlotIsFilled) {
  constexpr size_t n = sizeof(cl_icd_dispatch) / sizeof(void*);
  static_assert(n >= 149, "the 2023 headers' table has 149 slots");
  void* slots[n];
  std::memcpy(slots, &kDispatch, sizeof slots);
  for (size_t i = 0; i < n; ++i) EXPECT_NE(slots[i], nullptr) << "slot " << i;
}

TEST(DispatchTable, ObjectsStartWithTheTable) {
  cl_platform_id p = ThePlatform();
  EXPECT_EQ(*reinterpret_cast<const cl_icd_dispatch* const*>(p), &kDispatch);
  // Objects that take their header from tandem::ocl::Object keep it first too.
  _cl_context ctx;
  EXPECT_EQ(static_cast<void*>(&ctx), static_cast<void*>(&ctx.dispatch));
  EXPECT_EQ(ctx.dispatch, &kDispatch);
}

TEST(Exports, OnlyTheThreeIcdSymbols) {
  std::string cmd = std::string("nm -D --defined-only ") + TANDEM_OPENCL_SO;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::set<std::string> names;
  std::array<char, 512> line;
  while (fgets(line.data(), line.size(), f)) {
    std::string l(line.data());
    while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
    size_t sp = l.rfind(' ');
    std::string name = sp == std::string::npos ? l : l.substr(sp + 1);
    if (name.empty()) continue;
    if (size_t at = name.find('@'); at != std::string::npos) name.resize(at);
    names.insert(name);
  }
  ASSERT_EQ(pclose(f), 0) << cmd;
  EXPECT_EQ(names, (std::set<std::string>{"clGetExtensionFunctionAddress", "clGetExtensionFunctionAddressForPlatform",
                                          "clIcdGetPlatformIDsKHR"}));
}

// The real library, as the loader sees it.
class Library : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = dlopen(TANDEM_OPENCL_SO, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    gefa_ = reinterpret_cast<void* (*)(const char*)>(dlsym(handle_, "clGetExtensionFunctionAddress"));
    ASSERT_NE(gefa_, nullptr);
    icd_ = reinterpret_cast<clIcdGetPlatformIDsKHR_fn>(gefa_("clIcdGetPlatformIDsKHR"));
    ASSERT_NE(icd_, nullptr);
  }
  void TearDown() override {
    if (handle_) dlclose(handle_);
  }
  void* handle_ = nullptr;
  void* (*gefa_)(const char*) = nullptr;
  clIcdGetPlatformIDsKHR_fn icd_ = nullptr;
};

TEST_F(Library, NoPlatformWithoutServers) {
  unsetenv("TANDEM_SERVERS");
  cl_uint n = 7;
  EXPECT_EQ(icd_(0, nullptr, &n), CL_PLATFORM_NOT_FOUND_KHR);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(gefa_("clNoSuchFunction"), nullptr);
  // ocl-icd asks for clGetPlatformInfo this way, since it is not exported.
  EXPECT_NE(gefa_("clGetPlatformInfo"), nullptr);
}

TEST_F(Library, PlatformAnswersWhatTheLoaderChecks) {
  setenv("TANDEM_SERVERS", "127.0.0.1:1", 1);
  cl_uint n = 0;
  ASSERT_EQ(icd_(0, nullptr, &n), CL_SUCCESS);
  ASSERT_EQ(n, 1u);
  cl_platform_id p = nullptr;
  ASSERT_EQ(icd_(1, &p, nullptr), CL_SUCCESS);
  const auto* table = *reinterpret_cast<const cl_icd_dispatch* const*>(p);
  ASSERT_NE(table, nullptr);
  char buf[256];
  ASSERT_EQ(table->clGetPlatformInfo(p, CL_PLATFORM_ICD_SUFFIX_KHR, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_STREQ(buf, "TDM");
  ASSERT_EQ(table->clGetPlatformInfo(p, CL_PLATFORM_EXTENSIONS, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_NE(std::string(buf).find("cl_khr_icd"), std::string::npos);
  ASSERT_EQ(table->clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof buf, buf, nullptr), CL_SUCCESS);
  EXPECT_STREQ(buf, "Tandem");
  unsetenv("TANDEM_SERVERS");
}

TEST(Unsupported, ReturnTheApiErrorAndNeverCrash) {
  cl_int err = CL_SUCCESS;
  EXPECT_EQ(kDispatch.clCreateImage2D(nullptr, 0, nullptr, 4, 4, 0, nullptr, &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_OPERATION);
  err = CL_SUCCESS;
  EXPECT_EQ(kDispatch.clCreateImage(nullptr, 0, nullptr, nullptr, nullptr, &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_OPERATION);
  EXPECT_EQ(kDispatch.clCreateImage(nullptr, 0, nullptr, nullptr, nullptr, nullptr), nullptr);  // no errcode_ret
  EXPECT_EQ(kDispatch.clEnqueueNativeKernel(nullptr, nullptr, nullptr, 0, 0, nullptr, nullptr, 0, nullptr, nullptr),
            CL_INVALID_OPERATION);
  // Implemented now (separate compilation): invalid handles get the specification's codes.
  EXPECT_EQ(kDispatch.clCompileProgram(nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr),
            CL_INVALID_PROGRAM);
  err = CL_SUCCESS;
  EXPECT_EQ(kDispatch.clLinkProgram(nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_CONTEXT);
  EXPECT_EQ(kDispatch.clSVMAlloc(nullptr, 0, 64, 0), nullptr);
  kDispatch.clSVMFree(nullptr, nullptr);
  EXPECT_EQ(kDispatch.clRetainSampler(nullptr), CL_INVALID_SAMPLER);
  EXPECT_EQ(kDispatch.clGetImageInfo(nullptr, CL_IMAGE_WIDTH, 0, nullptr, nullptr), CL_INVALID_MEM_OBJECT);
  EXPECT_EQ(kDispatch.clSetCommandQueueProperty(nullptr, 0, CL_FALSE, nullptr), CL_INVALID_OPERATION);
  // Linux declares the Direct3D slots as void*: they are filled with a function all the same.
  auto d3d = reinterpret_cast<cl_int (*)()>(kDispatch.clGetDeviceIDsFromD3D10KHR);
  EXPECT_EQ(d3d(), CL_INVALID_OPERATION);
}

TEST(InfoRules, PlatformSizes) {
  cl_platform_id p = ThePlatform();
  size_t size = 0;
  ASSERT_EQ(kDispatch.clGetPlatformInfo(p, CL_PLATFORM_VERSION, 0, nullptr, &size), CL_SUCCESS);
  EXPECT_EQ(size, sizeof("OpenCL 1.2 Tandem 0.1"));
  char small[4];
  size_t reported = 0;
  EXPECT_EQ(kDispatch.clGetPlatformInfo(p, CL_PLATFORM_VERSION, sizeof small, small, &reported), CL_INVALID_VALUE);
  EXPECT_EQ(reported, size);
  std::string exact(size, 'x');
  ASSERT_EQ(kDispatch.clGetPlatformInfo(p, CL_PLATFORM_VERSION, size, exact.data(), nullptr), CL_SUCCESS);
  EXPECT_STREQ(exact.c_str(), "OpenCL 1.2 Tandem 0.1");
  char profile[32];
  ASSERT_EQ(kDispatch.clGetPlatformInfo(p, CL_PLATFORM_PROFILE, sizeof profile, profile, nullptr), CL_SUCCESS);
  EXPECT_STREQ(profile, "FULL_PROFILE");
  EXPECT_EQ(kDispatch.clGetPlatformInfo(p, 0x7777, 0, nullptr, &size), CL_INVALID_VALUE);
  EXPECT_EQ(kDispatch.clGetPlatformInfo(reinterpret_cast<cl_platform_id>(&size), CL_PLATFORM_NAME, 0, nullptr, &size),
            CL_INVALID_PLATFORM);
}

TEST(InfoRules, AnswerHelper) {
  using tandem::ocl::AnswerValue;
  cl_uint v = 0;
  size_t ret = 0;
  EXPECT_EQ(AnswerValue(sizeof v, &v, &ret, cl_uint{42}), CL_SUCCESS);
  EXPECT_EQ(v, 42u);
  EXPECT_EQ(ret, sizeof(cl_uint));
  ret = 0;
  EXPECT_EQ(AnswerValue(sizeof v - 1, &v, &ret, cl_uint{7}), CL_INVALID_VALUE);
  EXPECT_EQ(v, 42u);
  EXPECT_EQ(ret, sizeof(cl_uint));  // set even when the buffer is too small
  EXPECT_EQ(AnswerValue(0, nullptr, nullptr, cl_uint{7}), CL_SUCCESS);
}

TEST(InfoRules, PlatformListArguments) {
  setenv("TANDEM_SERVERS", "127.0.0.1:1", 1);
  cl_platform_id p = nullptr;
  cl_uint n = 0;
  EXPECT_EQ(kDispatch.clGetPlatformIDs(0, &p, nullptr), CL_INVALID_VALUE);
  EXPECT_EQ(kDispatch.clGetPlatformIDs(0, nullptr, nullptr), CL_INVALID_VALUE);
  EXPECT_EQ(kDispatch.clGetPlatformIDs(0, nullptr, &n), CL_SUCCESS);
  EXPECT_EQ(n, 1u);
  unsetenv("TANDEM_SERVERS");
}

// Handles that are not live Tandem objects are rejected without being dereferenced.
TEST(InfoRules, ForeignHandlesAreRejected) {
  alignas(16) unsigned char junk[64] = {};
  void* bogus = junk;
  size_t size = 0;
  EXPECT_EQ(kDispatch.clGetContextInfo(nullptr, CL_CONTEXT_NUM_DEVICES, 0, nullptr, &size), CL_INVALID_CONTEXT);
  EXPECT_EQ(kDispatch.clGetContextInfo(static_cast<cl_context>(bogus), CL_CONTEXT_NUM_DEVICES, 0, nullptr, &size),
            CL_INVALID_CONTEXT);
  EXPECT_EQ(kDispatch.clGetMemObjectInfo(static_cast<cl_mem>(bogus), CL_MEM_SIZE, 0, nullptr, &size),
            CL_INVALID_MEM_OBJECT);
  EXPECT_EQ(kDispatch.clRetainMemObject(static_cast<cl_mem>(bogus)), CL_INVALID_MEM_OBJECT);
  EXPECT_EQ(kDispatch.clReleaseKernel(static_cast<cl_kernel>(bogus)), CL_INVALID_KERNEL);
  EXPECT_EQ(kDispatch.clSetKernelArg(static_cast<cl_kernel>(bogus), 0, 4, junk), CL_INVALID_KERNEL);
  EXPECT_EQ(kDispatch.clReleaseEvent(nullptr), CL_INVALID_EVENT);
  EXPECT_EQ(kDispatch.clWaitForEvents(0, nullptr), CL_INVALID_VALUE);
  EXPECT_EQ(kDispatch.clGetProgramInfo(static_cast<cl_program>(bogus), CL_PROGRAM_NUM_DEVICES, 0, nullptr, &size),
            CL_INVALID_PROGRAM);
  EXPECT_EQ(kDispatch.clFlush(static_cast<cl_command_queue>(bogus)), CL_INVALID_COMMAND_QUEUE);
  EXPECT_EQ(kDispatch.clEnqueueBarrier(nullptr), CL_INVALID_COMMAND_QUEUE);
  cl_int err = CL_SUCCESS;
  EXPECT_EQ(kDispatch.clCreateBuffer(nullptr, 0, 16, nullptr, &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_CONTEXT);
  EXPECT_EQ(kDispatch.clCreateUserEvent(static_cast<cl_context>(bogus), &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_CONTEXT);
  EXPECT_EQ(kDispatch.clCreateContext(nullptr, 0, nullptr, nullptr, nullptr, &err), nullptr);
  EXPECT_EQ(err, CL_INVALID_VALUE);
  cl_uint formats = 5;
  EXPECT_EQ(kDispatch.clGetSupportedImageFormats(nullptr, 0, CL_MEM_OBJECT_IMAGE2D, 0, nullptr, &formats),
            CL_INVALID_CONTEXT);
}

}  // namespace
