// FormAbortably and WaitUnlessAborted: a process group's formation and a
// collective's wait that the end of their round (the agent's next round, a
// collective abort) cuts short, with real Gloo groups on an in-process
// store.
#include "worker/abortable.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/broken_pipes.h"
#include "worker/collective_abort.h"

namespace ddprun::worker {
namespace {

// Waits up to `bound` for `done`.
bool WaitFor(const std::function<bool()>& done, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

c10::intrusive_ptr<Collectives> FormGloo(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto options = ::c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(
      ::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size,
                                                       options);
}

class AbortableTest : public ::testing::Test {
 protected:
  // As in a worker (CreateProcessGroup does it): Gloo writes to a vanished
  // peer's socket without MSG_NOSIGNAL, and the SIGPIPE would kill this
  // test's process before Gloo fails the work (seen once with Debian 13's
  // libgloo0 in TheCollectivesOwnErrorIsRethrown).
  void SetUp() override { IgnoreBrokenPipes(); }
  void TearDown() override { ClearCollectiveAbort(); }
};

TEST_F(AbortableTest, AFormedGroupIsReturned) {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  auto other = std::async(std::launch::async, [store] {
    return FormAbortably(
        [store] { return FormGloo(store, 1, 2, std::chrono::seconds(60)); });
  });
  auto mine = FormAbortably(
      [store] { return FormGloo(store, 0, 2, std::chrono::seconds(60)); });
  auto theirs = other.get();
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  std::vector<at::Tensor> a = {torch::ones({4})};
  std::vector<at::Tensor> b = {torch::full({4}, 2.0)};
  auto wa = (*mine)->allreduce(a);
  auto wb = (*theirs)->allreduce(b);
  wa->wait();
  wb->wait();
  EXPECT_TRUE(torch::equal(a[0], torch::full({4}, 3.0)));
  EXPECT_EQ(AbandonedFormations(), 0);
}

// The agent's next round arrives while the group forms: the wait ends at
// once, though the formation itself cannot be interrupted, and the
// formation ends alone later.
TEST_F(AbortableTest, ARoundThatEndsWhileItsGroupFormsEndsTheWait) {
  absl::Notification release;
  auto formed = FormAbortably([&release]() -> c10::intrusive_ptr<Collectives> {
    RequestCollectiveAbort();  // as the control watcher does
    release.WaitForNotification();
    return {};
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kAborted)
      << formed.status();
  EXPECT_EQ(AbandonedFormations(), 1);
  release.Notify();
  EXPECT_TRUE(
      WaitFor([] { return AbandonedFormations() == 0; }, absl::Seconds(30)));
}

// Real Gloo, a peer that never comes (it was stopped or killed before it
// connected): the end of the round ends the wait (ABORTED, where waiting
// out Gloo's timeout would give UNAVAILABLE); the abandoned formation ends
// alone at that timeout.
TEST_F(AbortableTest, AGlooFormationWaitingForAGonePeerIsAbandoned) {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  std::thread round_ends([store] {
    // Once this rank published its address (it is in the formation).
    WaitFor([&store] { return store->getNumKeys() > 0; }, absl::Seconds(60));
    RequestCollectiveAbort();
  });
  auto formed = FormAbortably(
      [store] { return FormGloo(store, 0, 2, std::chrono::seconds(3)); });
  round_ends.join();
  ASSERT_GT(store->getNumKeys(), 0);
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kAborted)
      << formed.status();
  EXPECT_EQ(AbandonedFormations(), 1);
  EXPECT_TRUE(
      WaitFor([] { return AbandonedFormations() == 0; }, absl::Seconds(60)));
}

TEST_F(AbortableTest, NothingFormsOnceTheRoundEnded) {
  RequestCollectiveAbort();
  bool called = false;
  auto formed = FormAbortably([&called]() -> c10::intrusive_ptr<Collectives> {
    called = true;
    return {};
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(called);
}

TEST_F(AbortableTest, AnExceptionIsUnavailable) {
  auto formed = FormAbortably([]() -> c10::intrusive_ptr<Collectives> {
    throw std::runtime_error("Connection refused");
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(formed.status().message().find("Connection refused"),
            std::string::npos);
}

// LibTorch's errors (TORCH_CHECK, as the store client throws them) carry a
// backtrace in what(); the status quotes the message alone.
TEST_F(AbortableTest, ALibTorchErrorIsQuotedWithoutItsBacktrace) {
  auto formed = FormAbortably([]() -> c10::intrusive_ptr<Collectives> {
    TORCH_CHECK(false, "store Set of key 'k' failed: round 3 is over");
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(formed.status().message().find("round 3 is over"),
            std::string::npos);
  EXPECT_EQ(formed.status().message().find("Exception raised from"),
            std::string::npos)
      << formed.status().message();
  EXPECT_EQ(formed.status().message().find("frame #"), std::string::npos);
}

// Two ranks of a real Gloo group, formed on `store`.
std::pair<c10::intrusive_ptr<Collectives>, c10::intrusive_ptr<Collectives>>
FormPair() {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  auto other = std::async(std::launch::async, [store] {
    return FormGloo(store, 1, 2, std::chrono::seconds(60));
  });
  auto mine = FormGloo(store, 0, 2, std::chrono::seconds(60));
  return {mine, other.get()};
}

TEST_F(AbortableTest, ACompletedCollectiveIsWaitedFor) {
  auto [a, b] = FormPair();
  std::vector<at::Tensor> ta = {torch::ones({8})};
  std::vector<at::Tensor> tb = {torch::ones({8})};
  auto wa = a->allreduce(ta);
  auto wb = b->allreduce(tb);
  EXPECT_TRUE(WaitUnlessAborted(wa));
  EXPECT_TRUE(WaitUnlessAborted(wb));
  EXPECT_TRUE(torch::equal(ta[0], torch::full({8}, 2.0)));
}

// The peer never joins the allreduce (it moved on to the next round): the
// end of the round ends the wait; the work completes once the peer calls.
TEST_F(AbortableTest, ACollectiveThePeerNeverJoinsIsGivenUp) {
  auto [a, b] = FormPair();
  std::vector<at::Tensor> ta = {torch::ones({8})};
  auto wa = a->allreduce(ta);
  RequestCollectiveAbort();
  EXPECT_FALSE(WaitUnlessAborted(wa));
  EXPECT_FALSE(wa->isCompleted());
  ClearCollectiveAbort();
  std::vector<at::Tensor> tb = {torch::ones({8})};
  b->allreduce(tb)->wait();
  EXPECT_TRUE(WaitUnlessAborted(wa));
}

// The peer's group is destroyed in the middle (its process died): Gloo
// fails the work, and the wait rethrows that error; a watchdog turns a
// wait that Gloo never fails into a test failure, not a hang.
TEST_F(AbortableTest, TheCollectivesOwnErrorIsRethrown) {
  auto [a, b] = FormPair();
  std::vector<at::Tensor> ta = {torch::ones({1 << 16})};
  auto wa = a->allreduce(ta);
  b.reset();  // closes its sockets
  absl::Notification done;
  std::thread watchdog([&done] {
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      RequestCollectiveAbort();
    }
  });
  bool threw = false;
  try {
    WaitUnlessAborted(wa);
  } catch (const std::exception& e) {
    threw = true;
  }
  done.Notify();
  watchdog.join();
  EXPECT_TRUE(threw) << "Gloo did not fail the work of a vanished peer";
}

// A work that completes just as a wait's slice ends: c10d's wait(timeout)
// has thrown "Operation timed out!" for the slice, and isCompleted() is
// already true when the waiter looks. The race, made certain: the first
// sliced wait completes the work (with `error`, if any) and throws the
// slice's timeout, as c10d::Work::wait does when completion comes a moment
// late.
class CompletesAsTheSliceEnds : public ::c10d::Work {
 public:
  explicit CompletesAsTheSliceEnds(std::string error = "")
      : error_(std::move(error)) {}
  bool isCompleted() override { return completed_; }
  bool wait(std::chrono::milliseconds timeout) override {
    if (!completed_) {
      completed_ = true;
      TORCH_CHECK(false, "Operation timed out!");
    }
    TORCH_CHECK(error_.empty(), error_);
    return true;
  }

 private:
  const std::string error_;
  bool completed_ = false;
};

TEST(WaitUnlessAbortedTest, AWorkThatCompletesAsTheSliceEndsSucceeds) {
  c10::intrusive_ptr<::c10d::Work> work =
      c10::make_intrusive<CompletesAsTheSliceEnds>();
  EXPECT_TRUE(WaitUnlessAborted(work));
}

TEST(WaitUnlessAbortedTest, AWorkThatFailsAsTheSliceEndsThrowsItsOwnError) {
  c10::intrusive_ptr<::c10d::Work> work =
      c10::make_intrusive<CompletesAsTheSliceEnds>("the peer reset");
  try {
    WaitUnlessAborted(work);
    ADD_FAILURE() << "a failed work was waited for without an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the peer reset"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddprun::worker
