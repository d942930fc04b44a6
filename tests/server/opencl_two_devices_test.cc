// The OpenCL backend with two devices (PoCL's CPU device twice, POCL_DEVICES="pthread pthread",
// set before the first OpenCL call of the process): one context per device, so a wait list
// that names another device's event needs a bridge.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>

#include "opencl_backend.h"
#include "tandem/server/backend.h"

namespace tandem::server {
namespace {

using namespace std::chrono_literals;

class TwoDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("POCL_DEVICES", "pthread pthread", /*overwrite=*/1);
    auto b = MakeOpenCLBackend(BackendOptions{});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    be_ = std::move(b.value());
    if (be_->device_count() < 2) GTEST_SKIP() << "one OpenCL device (POCL_DEVICES=\"pthread pthread\" gives two)";
    cl_ = dynamic_cast<opencl::OpenCLBackend*>(be_.get());
    ASSERT_NE(cl_, nullptr);
    ir::BufferAllocRep rep;
    ASSERT_TRUE(be_->OnBufferAlloc({1, 1, kSize, 0, 0}, &rep).ok());  // on device 1
  }
  int32_t StatusOf(uint64_t event) {
    ir::EventQueryRep q;
    EXPECT_TRUE(be_->OnEventQuery({event}, &q).ok());
    return q.status;
  }
  // Polls until the event has ended (complete or failed), at most 10 s.
  int32_t Ended(uint64_t event) {
    int32_t st = StatusOf(event);
    for (auto until = std::chrono::steady_clock::now() + 10s; st > CL_COMPLETE && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(2ms);
      st = StatusOf(event);
    }
    return st;
  }
  // The buffer on device 1, read back (the session defers no reply here: the read is done).
  ir::bytes ReadBack() {
    ir::BufferReadRep rep;
    tandem::Status st = be_->OnBufferRead({0, 1, 0, kSize, {}, {}, 0}, &rep);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rep.data;
  }
  // A write to the buffer on device 1 behind `wait`; fails the test rather than hang when the
  // call does not return: `unblock` then lets it go.
  void WriteBehind(uint64_t wait, uint64_t signal, const ir::bytes& data, const std::function<void()>& unblock) {
    auto call = std::async(std::launch::async, [&] {
      ir::BufferWriteRep rep;
      return be_->OnBufferWrite({0, 1, 0, kSize, data, {}, {wait}, signal}, &rep);
    });
    if (call.wait_for(3s) != std::future_status::ready) {
      unblock();
      call.wait();
      FAIL() << "the write waited in the enqueue for another device's event";
    }
    tandem::Status st = call.get();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  static constexpr uint64_t kSize = 4096;
  std::unique_ptr<Backend> be_;
  opencl::OpenCLBackend* cl_ = nullptr;
};

// A user event of device 0 in the wait list of a write on device 1: the enqueue returns at
// once (the program may need an answer from this session before it sets the event: here, a
// query of the write), and the write runs once the event is set, or fails with it.
TEST_F(TwoDevices, AWaitForAnotherDevicesUserEventHoldsNoQuery) {
  ir::EventCreateRep erep;
  ir::UserEventSetRep urep;
  ir::EventDestroyRep drep;
  ASSERT_TRUE(be_->OnEventCreate({80, 0, ir::kEventUser}, &erep).ok());
  const ir::bytes data(kSize, 0x5a);
  ASSERT_NO_FATAL_FAILURE(WriteBehind(80, 81, data, [&] { be_->OnUserEventSet({80, CL_COMPLETE}, &urep); }));
  EXPECT_GT(StatusOf(81), CL_COMPLETE);
  EXPECT_EQ(cl_->open_gates(), 1) << "the stand-in";
  ASSERT_TRUE(be_->OnUserEventSet({80, CL_COMPLETE}, &urep).ok());
  EXPECT_EQ(Ended(81), CL_COMPLETE);
  EXPECT_EQ(ReadBack(), data);

  // Failed: the write fails with the event and does not run.
  ASSERT_TRUE(be_->OnEventCreate({82, 0, ir::kEventUser}, &erep).ok());
  ASSERT_NO_FATAL_FAILURE(
      WriteBehind(82, 83, ir::bytes(kSize, 0x11), [&] { be_->OnUserEventSet({82, CL_COMPLETE}, &urep); }));
  ASSERT_TRUE(be_->OnUserEventSet({82, -42}, &urep).ok());
  EXPECT_LT(Ended(83), 0);
  EXPECT_EQ(ReadBack(), data);
  for (uint64_t h : {80, 82}) ASSERT_TRUE(be_->OnEventDestroy({h}, &drep).ok());
  // The watcher's thread counts a gate closed just after setting it, which ends the write.
  for (int i = 0; i < 500 && !cl_->EnqueuedCompleteAlone(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(cl_->EnqueuedCompleteAlone()) << "a stand-in was left open";
}

// With nothing that waits for a user event, another device's event is waited for before the
// enqueue, with no stand-in (a command behind a user event is submitted late on NVIDIA).
TEST_F(TwoDevices, AnotherDevicesEventThatEndsAloneIsWaitedForFirst) {
  ir::BufferAllocRep arep;
  ASSERT_TRUE(be_->OnBufferAlloc({2, 0, kSize, 0, 0}, &arep).ok());  // on device 0
  ir::BufferWriteRep wrep;
  ASSERT_TRUE(be_->OnBufferWrite({0, 2, 0, kSize, ir::bytes(kSize, 3), {}, {}, 90}, &wrep).ok());
  const ir::bytes data(kSize, 4);
  ASSERT_TRUE(be_->OnBufferWrite({0, 1, 0, kSize, data, {}, {90}, 91}, &wrep).ok());
  EXPECT_TRUE(cl_->EnqueuedCompleteAlone());
  EXPECT_EQ(Ended(91), CL_COMPLETE);
  EXPECT_EQ(ReadBack(), data);
}

}  // namespace
}  // namespace tandem::server
