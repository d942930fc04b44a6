// LateReplies: the order in which replies that wait on the device leave (see its header).
// Each test's LateReplies is leaked: its detached threads outlive the test, as in the worker.
#include "tandem/server/late_replies.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::server {
namespace {

using namespace std::chrono_literals;

// What left, in wire order: each reply's id and the seqs of the errors it carried.
struct Sent {
  int id;
  std::vector<uint64_t> errors;
};

class Wire {
 public:
  void Add(std::vector<uint8_t> bytes) {
    Sent s{bytes[0], {}};
    for (size_t i = 1; i < bytes.size(); ++i) s.errors.push_back(bytes[i]);
    std::lock_guard lock(mu_);
    sent_.push_back(std::move(s));
    cv_.notify_all();
  }
  // Waits (bounded) until n replies have left; returns them.
  std::vector<Sent> AtLeast(size_t n, std::chrono::milliseconds bound = 10s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, bound, [&] { return sent_.size() >= n; });
    return sent_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Sent> sent_;
};

// A wait the test ends (Release), with the device work it stands for done from `done_at`:
// Release() or, with kDoneEarly, at once.
class Gate : public std::enable_shared_from_this<Gate> {
 public:
  enum Done { kDoneAtRelease, kDoneEarly };
  explicit Gate(Done d = kDoneAtRelease) : work_done_(d == kDoneEarly) {}
  void Release() {
    std::lock_guard lock(mu_);
    work_done_ = true;
    open_ = true;
    cv_.notify_all();
  }
  // Holds the gate: a side thread may still wait on it after a failed test has returned.
  DeferredWait Wait() {
    return DeferredWait{[self = shared_from_this()] {
                          std::unique_lock lock(self->mu_);
                          self->cv_.wait(lock, [&] { return self->open_; });
                          return Status::Ok();
                        },
                        [self = shared_from_this()] {
                          std::lock_guard lock(self->mu_);
                          return self->work_done_;
                        }};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  bool work_done_;
};

LateReply Reply(int id, DeferredWait wait, bool may_block, std::vector<uint64_t> error_seqs = {}) {
  LateReply r;
  r.wait = std::move(wait);
  r.reply = [id](const Status&, std::vector<ir::AsyncError> errors) {
    std::vector<uint8_t> bytes{static_cast<uint8_t>(id)};
    for (const ir::AsyncError& e : errors) bytes.push_back(static_cast<uint8_t>(e.seq));
    return bytes;
  };
  for (uint64_t seq : error_seqs) {
    ir::AsyncError e;
    e.seq = seq;
    r.errors.push_back(e);
  }
  r.may_block = may_block;
  return r;
}

DeferredWait Now() {
  return DeferredWait{[] { return Status::Ok(); }, nullptr};
}

LateReplies* Started(const std::shared_ptr<Wire>& wire) {
  auto* lr = new LateReplies([wire](std::vector<uint8_t> b) { wire->Add(std::move(b)); });
  lr->Start();
  return lr;
}

// The deadlock this exists for: one thread of the program waits for a user event that another
// thread sets only after its own clFinish has returned. The finish's reply leaves first, with
// the errors the blocked one carried, which then leaves without them.
TEST(LateReplies, AReplyThatMayBlockDoesNotHoldTheOnesAfterIt) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  auto user_event = std::make_shared<Gate>();
  std::vector<LateReply> batch;
  batch.push_back(Reply(1, user_event->Wait(), true, {11}));
  batch.push_back(Reply(2, Now(), true, {12}));
  lr->Push(std::move(batch));
  std::vector<Sent> sent = wire->AtLeast(1);
  ASSERT_EQ(sent.size(), 1u) << "the reply after a blocked one did not leave";
  EXPECT_EQ(sent[0].id, 2);
  EXPECT_EQ(sent[0].errors, (std::vector<uint64_t>{11, 12}));
  EXPECT_FALSE(lr->Idle());
  user_event->Release();
  sent = wire->AtLeast(2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].id, 1);
  EXPECT_TRUE(sent[1].errors.empty());
  for (int i = 0; i < 1000 && !lr->Idle(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(lr->Idle());
}

// The same with the later reply on the in-order thread (handed over when nothing could block).
TEST(LateReplies, AnInOrderReplyPassesABlockedOneBeforeIt) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  auto user_event = std::make_shared<Gate>();
  std::vector<LateReply> first;
  first.push_back(Reply(1, user_event->Wait(), true));
  lr->Push(std::move(first));
  std::vector<LateReply> second;
  second.push_back(Reply(2, Now(), false));
  lr->Push(std::move(second));
  std::vector<Sent> sent = wire->AtLeast(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].id, 2);
  user_event->Release();
  EXPECT_EQ(wire->AtLeast(2).size(), 2u);
}

// An earlier reply whose device work is done but which has not left (a read copying its
// bytes): a later one waits for it, since its own completion may imply that read's.
TEST(LateReplies, AReplyWaitsForAnEarlierOneWhoseWorkIsDone) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  auto read = std::make_shared<Gate>(Gate::kDoneEarly);
  std::vector<LateReply> batch;
  batch.push_back(Reply(1, read->Wait(), true, {11}));
  batch.push_back(Reply(2, Now(), true, {12}));
  lr->Push(std::move(batch));
  EXPECT_TRUE(wire->AtLeast(1, 300ms).empty()) << "a reply left before an earlier one whose work was done";
  read->Release();
  std::vector<Sent> sent = wire->AtLeast(2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].id, 1);
  EXPECT_EQ(sent[0].errors, (std::vector<uint64_t>{11}));
  EXPECT_EQ(sent[1].id, 2);
  EXPECT_EQ(sent[1].errors, (std::vector<uint64_t>{12}));
}

// An in-order reply behind a side one whose work is done (a read that only copies its bytes
// now) leaves after it, and a side reply that took its place first leaves first even when
// building its reply takes long.
TEST(LateReplies, AnInOrderReplyWaitsForADoneSideReplyAndTicketsKeepTheirOrder) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  auto read = std::make_shared<Gate>(Gate::kDoneEarly);
  std::vector<LateReply> first;
  first.push_back(Reply(1, read->Wait(), true));
  // Slow to build: cleared before reply 3, it must still leave before it.
  first.push_back(Reply(2, Now(), true));
  first[1].reply = [inner = first[1].reply](const Status& st, std::vector<ir::AsyncError> errors) {
    std::this_thread::sleep_for(200ms);
    return inner(st, std::move(errors));
  };
  lr->Push(std::move(first));
  std::vector<LateReply> second;
  second.push_back(Reply(3, Now(), false));
  lr->Push(std::move(second));
  EXPECT_TRUE(wire->AtLeast(1, 200ms).empty()) << "a reply left before an earlier one whose work was done";
  read->Release();
  std::vector<Sent> sent = wire->AtLeast(3);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].id, 1);
  EXPECT_EQ(sent[1].id, 2);
  EXPECT_EQ(sent[2].id, 3);
}

// Replies that cannot block leave in the order they were handed over, whatever their waits
// take, and each carries its own errors.
TEST(LateReplies, InOrderRepliesLeaveInOrder) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  std::vector<LateReply> batch;
  for (int i = 0; i < 6; ++i) {
    const auto pause = std::chrono::milliseconds((6 - i) * 5);
    batch.push_back(Reply(i, DeferredWait{[pause] {
                                            std::this_thread::sleep_for(pause);
                                            return Status::Ok();
                                          },
                                          nullptr},
                          false, {static_cast<uint64_t>(100 + i)}));
  }
  lr->Push(std::move(batch));
  std::vector<Sent> sent = wire->AtLeast(6);
  ASSERT_EQ(sent.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(sent[i].id, i);
    EXPECT_EQ(sent[i].errors, (std::vector<uint64_t>{static_cast<uint64_t>(100 + i)}));
  }
}

// Threads named like the side threads, in this process.
int SideThreads() {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    n += name == "tdm-wait-ue";
  }
  return n;
}

// A program that keeps a user event while it reads back many times: each reply may block,
// but one side thread runs them all, one after another, instead of a thread each.
TEST(LateReplies, SideThreadsAreReused) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  const int before = SideThreads();
  for (int i = 0; i < 50; ++i) {
    std::vector<LateReply> one;
    one.push_back(Reply(i, Now(), true));
    lr->Push(std::move(one));
    ASSERT_EQ(wire->AtLeast(i + 1).size(), static_cast<size_t>(i + 1));
    for (int t = 0; t < 5000 && !lr->Idle(); ++t) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(SideThreads() - before, 1);
}

// A program that reads back 100 times behind one user event (each read through host memory
// holds a side thread until its device copy ends), then waits for something else before it
// sets the event: that wait's reply must not queue behind the blocked ones (at 64 side threads
// it did, for ever). After the burst, the threads past kKeptSideThreads end.
TEST(LateReplies, ManyBlockedRepliesDoNotHoldOneThatCanLeave) {
  auto wire = std::make_shared<Wire>();
  LateReplies* lr = Started(wire);
  const int before = SideThreads();
  auto user_event = std::make_shared<Gate>();
  constexpr int kBlocked = 100;
  std::vector<LateReply> batch;
  for (int i = 0; i < kBlocked; ++i) batch.push_back(Reply(i, user_event->Wait(), true));
  lr->Push(std::move(batch));
  std::vector<LateReply> other;
  other.push_back(Reply(200, Now(), true));
  lr->Push(std::move(other));
  std::vector<Sent> sent = wire->AtLeast(1);
  ASSERT_EQ(sent.size(), 1u) << "a reply that can leave waited behind " << kBlocked << " blocked ones";
  EXPECT_EQ(sent[0].id, 200);
  user_event->Release();
  sent = wire->AtLeast(kBlocked + 1);
  ASSERT_EQ(sent.size(), static_cast<size_t>(kBlocked + 1));
  for (int i = 0; i < 1000 && !lr->Idle(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(lr->Idle());
  int extra = SideThreads() - before;
  for (int i = 0; i < 100 && extra > static_cast<int>(LateReplies::kKeptSideThreads); ++i) {
    std::this_thread::sleep_for(50ms);
    extra = SideThreads() - before;
  }
  EXPECT_EQ(extra, static_cast<int>(LateReplies::kKeptSideThreads));
  // The ones kept still serve, with no thread started for it.
  std::vector<LateReply> again;
  again.push_back(Reply(201, Now(), true));
  lr->Push(std::move(again));
  sent = wire->AtLeast(kBlocked + 2);
  ASSERT_EQ(sent.size(), static_cast<size_t>(kBlocked + 2));
  EXPECT_EQ(sent.back().id, 201);
  EXPECT_EQ(SideThreads() - before, static_cast<int>(LateReplies::kKeptSideThreads));
}

// Run in the caller's order (the worker before its waiter starts): the reply carries its errors.
TEST(LateReplies, ARunReplyCarriesItsOwnErrors) {
  LateReply r = Reply(7, Now(), false, {3, 4});
  const std::vector<uint8_t> bytes = r();
  EXPECT_EQ(bytes, (std::vector<uint8_t>{7, 3, 4}));
}

}  // namespace
}  // namespace tandem::server
