// FormAbortably: a process group's formation that the end of its round
// (the agent's next round, a collective abort) cuts short, with real Gloo
// groups on an in-process store.
#include "worker/group_formation.h"

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

class GroupFormationTest : public ::testing::Test {
 protected:
  void TearDown() override { ClearCollectiveAbort(); }
};

TEST_F(GroupFormationTest, AFormedGroupIsReturned) {
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
TEST_F(GroupFormationTest, ARoundThatEndsWhileItsGroupFormsEndsTheWait) {
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
TEST_F(GroupFormationTest, AGlooFormationWaitingForAGonePeerIsAbandoned) {
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

TEST_F(GroupFormationTest, NothingFormsOnceTheRoundEnded) {
  RequestCollectiveAbort();
  bool called = false;
  auto formed = FormAbortably([&called]() -> c10::intrusive_ptr<Collectives> {
    called = true;
    return {};
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(called);
}

TEST_F(GroupFormationTest, AnExceptionIsUnavailable) {
  auto formed = FormAbortably([]() -> c10::intrusive_ptr<Collectives> {
    throw std::runtime_error("Connection refused");
  });
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(formed.status().message().find("Connection refused"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::worker
