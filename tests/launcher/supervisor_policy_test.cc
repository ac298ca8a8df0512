#include "launcher/agent/supervisor_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

using Verdict = SupervisorPolicy::Verdict;

TEST(SupervisorPolicyTest, SucceedsWhenEveryWorkerExitsZero) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, clock);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnExit(0, ExitStatus::Exited(0));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnExit(1, ExitStatus::Exited(0));
  EXPECT_EQ(policy.Evaluate(), Verdict::kSucceeded);
  EXPECT_TRUE(policy.failures().empty());
}

TEST(SupervisorPolicyTest, OneNonZeroExitFailsTheGroupWithTheRootCauseFirst) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, clock);
  policy.OnExit(2, ExitStatus::Exited(3));
  absl::Time first = clock.Now();
  clock.Advance(absl::Seconds(1));
  policy.OnExit(0, ExitStatus::Signaled(9));
  EXPECT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 2u);
  EXPECT_EQ(policy.failures()[0].local_rank, 2);
  EXPECT_EQ(policy.failures()[0].cause, v1::FAILURE_CAUSE_EXITED);
  EXPECT_EQ(policy.failures()[0].exit.exit_code, 3);
  EXPECT_EQ(policy.failures()[0].time, first);
  EXPECT_EQ(policy.failures()[1].cause, v1::FAILURE_CAUSE_SIGNALED);
  EXPECT_EQ(policy.failures()[1].exit.signal, 9);
}

TEST(SupervisorPolicyTest, SilentAfterProgressPastTheTimeoutIsHung) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 2, .worker_timeout = absl::Seconds(5)}, clock);
  EXPECT_FALSE(policy.NextHangDeadline().has_value());
  policy.OnProgress(1);
  EXPECT_EQ(policy.NextHangDeadline(), clock.Now() + absl::Seconds(5));
  clock.Advance(absl::Seconds(4));
  policy.OnProgress(0);  // rank 0 keeps reporting
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_EQ(policy.failures()[0].cause, v1::FAILURE_CAUSE_HUNG);
  // Killing the hung worker afterwards adds no second failure.
  policy.OnExit(1, ExitStatus::Signaled(15));
  EXPECT_EQ(policy.failures().size(), 1u);
}

TEST(SupervisorPolicyTest, WorkersThatNeverReportAreNeverHung) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 1, .worker_timeout = absl::Seconds(1)}, clock);
  clock.Advance(absl::Hours(10));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
}

TEST(SupervisorPolicyTest, HangDetectionOffWithZeroTimeout) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, clock);
  policy.OnProgress(0);
  clock.Advance(absl::Hours(10));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  EXPECT_FALSE(policy.NextHangDeadline().has_value());
}


// In-place recovery (issue 13): the decision to keep the survivors.

TEST(SupervisorPolicyTest, AKilledWorkerOfADeclaredGroupIsReplacedInPlace) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, clock);
  for (int i = 0; i < 3; ++i) policy.OnInPlaceDeclared(i);
  policy.OnExit(1, ExitStatus::Signaled(9));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_TRUE(decision.kill.empty());  // it is gone already
}

TEST(SupervisorPolicyTest, AWorkerThatDidNotDeclareMeansRestartAll) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, clock);
  policy.OnInPlaceDeclared(0);  // rank 1 is, say, a Python script
  policy.OnExit(0, ExitStatus::Exited(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_FALSE(decision.in_place);
  EXPECT_TRUE(decision.replace.empty());
}

TEST(SupervisorPolicyTest, AHungDeclaredWorkerIsKilledAndReplaced) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 2, .worker_timeout = absl::Seconds(2)}, clock);
  policy.OnInPlaceDeclared(0);
  policy.OnInPlaceDeclared(1);
  policy.OnProgress(0);
  policy.OnProgress(1);
  clock.Advance(absl::Seconds(1));
  policy.OnProgress(1);
  clock.Advance(absl::Seconds(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{0});
  EXPECT_EQ(decision.kill, std::vector<int>{0});
}

TEST(SupervisorPolicyTest, AStoppedWorkerIsTheHangAndItsPeersAreKept) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 3, .worker_timeout = absl::Seconds(2)}, clock);
  for (int i = 0; i < 3; ++i) {
    policy.OnInPlaceDeclared(i);
    policy.OnProgress(i);
  }
  // Rank 1 is stopped; 0 and 2 then wait for it in a collective: all three
  // go silent together.
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 3u);
  policy.OnStopped(1);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

// An in-place round's state sync: survivor 0 (no progress in this round
// yet) stops in it; new member 1 (progress: it declared in place) waits for
// it and goes silent. Only 1 is hung by the clock; the stopped survivor is
// the culprit, and 1 is kept.
TEST(SupervisorPolicyTest, AWorkerStoppedBeforeItsFirstProgressIsTheHang) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2,
                           .worker_timeout = absl::Seconds(2),
                           .in_place = {true, false}},
                          clock);
  policy.OnInPlaceDeclared(1);
  policy.OnProgress(1);
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  policy.OnStopped(0);
  ASSERT_EQ(policy.failures().size(), 2u);
  EXPECT_EQ(policy.failures()[1].local_rank, 0);
  EXPECT_EQ(policy.failures()[1].cause, v1::FAILURE_CAUSE_HUNG);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{0});
  EXPECT_EQ(decision.kill, std::vector<int>{0});
}

TEST(SupervisorPolicyTest, SilentWorkersWithNoneStoppedAreAllReplaced) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 2, .worker_timeout = absl::Seconds(2)}, clock);
  for (int i = 0; i < 2; ++i) {
    policy.OnInPlaceDeclared(i);
    policy.OnProgress(i);
  }
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, (std::vector<int>{0, 1}));
  EXPECT_EQ(decision.kill, (std::vector<int>{0, 1}));
}

TEST(SupervisorPolicyTest, AWorkerThatFinishedMeansRestartAll) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, clock);
  policy.OnInPlaceDeclared(0);
  policy.OnInPlaceDeclared(1);
  policy.OnExit(0, ExitStatus::Exited(0));
  policy.OnExit(1, ExitStatus::Exited(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_FALSE(policy.DecideRecovery().in_place);
}

TEST(SupervisorPolicyTest, AnotherNodesFailureKeepsEveryDeclaredWorker) {
  common::FakeClock clock;
  // Declarations carry over from the previous round of the same processes.
  SupervisorPolicy policy({.num_workers = 2, .in_place = {true, true}}, clock);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_TRUE(decision.replace.empty());
  EXPECT_EQ(policy.in_place_declared(), (std::vector<bool>{true, true}));
}

// The agent sleeps a monitor interval, or less when a worker could become
// hung sooner; never a negative time.
TEST(SupervisorPolicyTest, WaitBeforeIsCutShortByTheNextHangDeadline) {
  common::FakeClock clock;
  SupervisorPolicy quiet({.num_workers = 2}, clock);
  EXPECT_EQ(quiet.WaitBefore(absl::Seconds(1)), absl::Seconds(1));
  SupervisorPolicy policy(
      {.num_workers = 2, .worker_timeout = absl::Seconds(5)}, clock);
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::Seconds(1))
      << "no progress yet: nobody can be hung";
  policy.OnProgress(0);
  clock.Advance(absl::Milliseconds(4700));
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::Milliseconds(300));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::ZeroDuration());
}

// Workers silent together, none stopped, in a round of several nodes: their
// agent gives the other node's report one more worker timeout; alone, or with
// a stopped worker here, or after that timeout, they are hung.
TEST(SupervisorPolicyTest, SilentWorkersOfAMultiNodeRoundAwaitTheRemoteCause) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 2, .worker_timeout = absl::Seconds(5)}, clock);
  policy.OnProgress(0);
  policy.OnProgress(1);
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(policy.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  EXPECT_TRUE(policy.AwaitsRemoteCause(2));
  EXPECT_FALSE(policy.AwaitsRemoteCause(1)) << "one node: nobody else reports";
  clock.Advance(absl::Seconds(5));
  EXPECT_FALSE(policy.AwaitsRemoteCause(2)) << "one more timeout has passed";

  SupervisorPolicy stopped(
      {.num_workers = 2, .worker_timeout = absl::Seconds(5)}, clock);
  stopped.OnProgress(0);
  stopped.OnProgress(1);
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(stopped.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  stopped.OnStopped(1);
  EXPECT_FALSE(stopped.AwaitsRemoteCause(2)) << "the cause is stopped here";

  SupervisorPolicy exited({.num_workers = 2}, clock);
  exited.OnExit(0, ExitStatus::Exited(1));
  ASSERT_EQ(exited.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  EXPECT_FALSE(exited.AwaitsRemoteCause(2)) << "an exit here is the cause";
}

}  // namespace
}  // namespace ddprun::launcher
