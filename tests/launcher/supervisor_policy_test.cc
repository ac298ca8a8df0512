#include "launcher/agent/supervisor_policy.h"

#include <deque>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/failure_report.h"

namespace ddprun::launcher {
namespace {

using Verdict = SupervisorPolicy::Verdict;
using common::Phase;
using common::ProgressRecord;

ProgressRecord StepRecord() { return {.kind = ProgressRecord::Kind::kStep}; }
ProgressRecord PhaseRecord(Phase phase) {
  return {.kind = ProgressRecord::Kind::kPhase, .phase = phase};
}
void Step(SupervisorPolicy& policy, int local_rank) {
  policy.OnRecord(local_rank, StepRecord());
}
// A step record as libddp writes it: with the rank's compute time.
void FiguredStep(SupervisorPolicy& policy, int local_rank) {
  policy.OnRecord(local_rank, {.kind = ProgressRecord::Kind::kStep,
                               .compute_seconds = 0.01});
}
// Three steps of 50 ms, recorded by every rank as libddp does.
void ThreeFiguredSteps(SupervisorPolicy& policy, common::FakeClock& clock,
                       int workers) {
  for (int step = 0; step < 3; ++step) {
    clock.Advance(absl::Milliseconds(50));
    for (int i = 0; i < workers; ++i) FiguredStep(policy, i);
  }
}
// A look at a process asleep (state S) with `cpu_ms` of CPU used.
ProcessState Asleep(int cpu_ms) {
  return {.state = 'S', .cpu = absl::Milliseconds(cpu_ms)};
}

class SupervisorPolicyTest : public ::testing::Test {
 protected:
  // Each policy its own bounds (they outlive it).
  PhaseBounds& Adaptive(PhaseBoundsOptions options = {}) {
    return bounds_.emplace_back(options);
  }
  // As --worker-timeout sets them: every phase but the start fixed.
  PhaseBounds& Fixed(absl::Duration bound) {
    PhaseBoundsOptions options;
    for (int i = 1; i < common::kNumPhases; ++i) options.fixed[i] = bound;
    return Adaptive(options);
  }

  std::deque<PhaseBounds> bounds_;
};

TEST_F(SupervisorPolicyTest, SucceedsWhenEveryWorkerExitsZero) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnExit(0, ExitStatus::Exited(0));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnExit(1, ExitStatus::Exited(0));
  EXPECT_EQ(policy.Evaluate(), Verdict::kSucceeded);
  EXPECT_TRUE(policy.failures().empty());
}

TEST_F(SupervisorPolicyTest, OneNonZeroExitFailsTheGroupWithTheRootCauseFirst) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, Adaptive(), clock);
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

TEST_F(SupervisorPolicyTest, SilentAfterProgressPastTheTimeoutIsHung) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Fixed(absl::Seconds(5)), clock);
  EXPECT_FALSE(policy.NextHangDeadline().has_value());
  Step(policy, 1);
  EXPECT_EQ(policy.NextHangDeadline(), clock.Now() + absl::Seconds(5));
  clock.Advance(absl::Seconds(4));
  Step(policy, 0);  // rank 0 keeps reporting
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

TEST_F(SupervisorPolicyTest, WorkersThatNeverReportAreNeverHung) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, Fixed(absl::Seconds(1)), clock);
  clock.Advance(absl::Hours(10));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
}

TEST_F(SupervisorPolicyTest, HangDetectionOffWithInfiniteBounds) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, Fixed(absl::InfiniteDuration()),
                          clock);
  Step(policy, 0);
  clock.Advance(absl::Hours(10));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  EXPECT_FALSE(policy.NextHangDeadline().has_value());
}

// In-place recovery: the decision to keep the survivors, so that a
// program that declared it loses one worker's step, not every worker's.

TEST_F(SupervisorPolicyTest, AKilledWorkerOfADeclaredGroupIsReplacedInPlace) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, Adaptive(), clock);
  for (int i = 0; i < 3; ++i) policy.OnInPlaceDeclared(i);
  policy.OnExit(1, ExitStatus::Signaled(9));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_TRUE(decision.kill.empty());  // it is gone already
}

TEST_F(SupervisorPolicyTest, AWorkerThatDidNotDeclareMeansRestartAll) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  policy.OnInPlaceDeclared(0);  // rank 1 is, say, a Python script
  policy.OnExit(0, ExitStatus::Exited(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_FALSE(decision.in_place);
  EXPECT_TRUE(decision.replace.empty());
}

// A replacement stopped or killed in its start-up, before it could declare
// in-place recovery, is replaced again; its declared peer keeps its state.
// (Restarting the whole node for it left fresh workers beside the other
// nodes' survivors, and the round stalled until the join bound.)
TEST_F(SupervisorPolicyTest,
       AReplacementLostBeforeItDeclaredIsReplacedInPlace) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2,
                           .expect_reports = {true, true},
                           .in_place = {false, true}},
                          Adaptive(), clock);
  policy.OnProcessState(0, /*stopped=*/true);
  clock.Advance(absl::Milliseconds(300));
  policy.OnProcessState(0, /*stopped=*/true);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{0});
  EXPECT_EQ(decision.kill, std::vector<int>{0});
  // Whereas a running worker that never declared still restarts the node.
  SupervisorPolicy other({.num_workers = 2, .in_place = {false, true}},
                         Adaptive(), clock);
  other.OnExit(1, ExitStatus::Signaled(9));
  ASSERT_EQ(other.Evaluate(), Verdict::kFailed);
  EXPECT_FALSE(other.DecideRecovery().in_place);
}

TEST_F(SupervisorPolicyTest, AHungDeclaredWorkerIsKilledAndReplaced) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Fixed(absl::Seconds(2)), clock);
  policy.OnInPlaceDeclared(0);
  policy.OnInPlaceDeclared(1);
  Step(policy, 0);
  Step(policy, 1);
  clock.Advance(absl::Seconds(1));
  Step(policy, 1);
  clock.Advance(absl::Seconds(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{0});
  EXPECT_EQ(decision.kill, std::vector<int>{0});
}

TEST_F(SupervisorPolicyTest, AStoppedWorkerIsTheHangAndItsPeersAreKept) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, Fixed(absl::Seconds(2)), clock);
  for (int i = 0; i < 3; ++i) {
    policy.OnInPlaceDeclared(i);
    Step(policy, i);
  }
  // Rank 1 is stopped; 0 and 2 then wait for it in a collective: all three
  // go silent together, and the stopped one is found by its state first.
  policy.OnProcessState(1, true);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_TRUE(policy.failures()[0].stopped);
  EXPECT_EQ(policy.failures()[0].phase, common::Phase::kStep);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

// An in-place round's state sync: survivor 1 stops in it; new member 0
// waits for it. The stopped survivor is the culprit, and 0 is kept, even
// when 0 was found silent first.
TEST_F(SupervisorPolicyTest, AWorkerStoppedBeforeItsFirstProgressIsTheHang) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2, .in_place = {false, true}},
                          Fixed(absl::Seconds(2)), clock);
  policy.OnInPlaceDeclared(0);
  Step(policy, 0);
  clock.Advance(absl::Seconds(2));
  policy.OnProcessState(1, true);  // seen stopped only now
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 2u);
  EXPECT_EQ(policy.failures()[0].local_rank, 0);
  EXPECT_FALSE(policy.failures()[0].stopped);
  EXPECT_EQ(policy.failures()[1].local_rank, 1);
  EXPECT_EQ(policy.failures()[1].cause, v1::FAILURE_CAUSE_HUNG);
  EXPECT_TRUE(policy.failures()[1].stopped);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

TEST_F(SupervisorPolicyTest, SilentWorkersWithNoneStoppedAreAllReplaced) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Fixed(absl::Seconds(2)), clock);
  for (int i = 0; i < 2; ++i) {
    policy.OnInPlaceDeclared(i);
    Step(policy, i);
  }
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, (std::vector<int>{0, 1}));
  EXPECT_EQ(decision.kill, (std::vector<int>{0, 1}));
}

TEST_F(SupervisorPolicyTest, AWorkerThatFinishedMeansRestartAll) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  policy.OnInPlaceDeclared(0);
  policy.OnInPlaceDeclared(1);
  policy.OnExit(0, ExitStatus::Exited(0));
  policy.OnExit(1, ExitStatus::Exited(2));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_FALSE(policy.DecideRecovery().in_place);
}

TEST_F(SupervisorPolicyTest, AnotherNodesFailureKeepsEveryDeclaredWorker) {
  common::FakeClock clock;
  // Declarations carry over from the previous round of the same processes.
  SupervisorPolicy policy({.num_workers = 2, .in_place = {true, true}},
                          Adaptive(), clock);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_TRUE(decision.replace.empty());
  EXPECT_EQ(policy.in_place_declared(), (std::vector<bool>{true, true}));
}

// The agent sleeps a monitor interval, or less when a worker could become
// hung sooner; never a negative time.
TEST_F(SupervisorPolicyTest, WaitBeforeIsCutShortByTheNextHangDeadline) {
  common::FakeClock clock;
  SupervisorPolicy quiet({.num_workers = 2}, Adaptive(), clock);
  EXPECT_EQ(quiet.WaitBefore(absl::Seconds(1)), absl::Seconds(1));
  SupervisorPolicy policy({.num_workers = 2}, Fixed(absl::Seconds(5)), clock);
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::Seconds(1))
      << "no progress yet: nobody can be hung";
  Step(policy, 0);
  clock.Advance(absl::Milliseconds(4700));
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::Milliseconds(300));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(policy.WaitBefore(absl::Seconds(1)), absl::ZeroDuration());
}

// Workers silent together, none stopped, in a round of several nodes: their
// agent gives the other node's report one more worker timeout; alone, or with
// a stopped worker here, or after that timeout, they are hung.
TEST_F(SupervisorPolicyTest,
       SilentWorkersOfAMultiNodeRoundAwaitTheRemoteCause) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Fixed(absl::Seconds(5)), clock);
  Step(policy, 0);
  Step(policy, 1);
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(policy.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  EXPECT_TRUE(policy.AwaitsRemoteCause(2));
  EXPECT_FALSE(policy.AwaitsRemoteCause(1)) << "one node: nobody else reports";
  clock.Advance(absl::Seconds(5));
  EXPECT_FALSE(policy.AwaitsRemoteCause(2)) << "one more timeout has passed";

  SupervisorPolicy stopped({.num_workers = 2}, Fixed(absl::Seconds(5)), clock);
  Step(stopped, 0);
  Step(stopped, 1);
  clock.Advance(absl::Seconds(6));
  stopped.OnProcessState(1, true);
  ASSERT_EQ(stopped.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  EXPECT_FALSE(stopped.AwaitsRemoteCause(2)) << "the cause is stopped here";

  SupervisorPolicy exited({.num_workers = 2}, Adaptive(), clock);
  exited.OnExit(0, ExitStatus::Exited(1));
  ASSERT_EQ(exited.Evaluate(), SupervisorPolicy::Verdict::kFailed);
  EXPECT_FALSE(exited.AwaitsRemoteCause(2)) << "an exit here is the cause";
}

// Hangs in every phase of a worker's life, with bounds that adapt to what
// each phase took so far: one fixed timeout is either too long for a step
// or too short for a first step.

TEST(PhaseBoundsTest, ABoundIsAMultipleOfTheLongestSeenAndNeverBelowItsFloor) {
  PhaseBoundsOptions options;
  options.factor = 5;
  PhaseBounds bounds(options);
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(10)) << "the floor";
  bounds.Observe(Phase::kStep, absl::Milliseconds(20));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(10));
  bounds.Observe(Phase::kStep, absl::Seconds(3));
  bounds.Observe(Phase::kStep, absl::Seconds(1));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(15)) << "5 x 3 s";
  EXPECT_EQ(bounds.Bound(Phase::kJoin), absl::Seconds(120)) << "own history";
}

// A phase seen often enough keeps the learned floor: a join that took a
// second three times is bounded at 30 s, not 2 minutes.
TEST(PhaseBoundsTest, AFrequentPhaseIsBoundedByTheLearnedFloor) {
  PhaseBounds bounds;
  bounds.Observe(Phase::kJoin, absl::Seconds(1));
  bounds.Observe(Phase::kJoin, absl::Seconds(1));
  EXPECT_EQ(bounds.Bound(Phase::kJoin), absl::Seconds(120));
  bounds.Observe(Phase::kJoin, absl::Seconds(1));
  EXPECT_EQ(bounds.Bound(Phase::kJoin), absl::Seconds(30));
  bounds.Observe(Phase::kJoin, absl::Seconds(20));
  EXPECT_EQ(bounds.Bound(Phase::kJoin), absl::Seconds(100)) << "5 x 20 s";
}

// Until three steps were seen, the first step stands for them: a model
// whose first step took 4 s on a loaded machine may take 11 s for its
// second without being hung. Once steps carry their own figures, a long
// first step (warming caches, allocating) no longer widens the bound.
TEST(PhaseBoundsTest, UntilStepsAreLearnedTheFirstStepBoundsThemToo) {
  PhaseBounds bounds;
  bounds.Observe(Phase::kFirstStep, absl::Seconds(4));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(20)) << "5 x 4 s";
  bounds.Observe(Phase::kStep, absl::Seconds(1));
  bounds.Observe(Phase::kStep, absl::Seconds(1));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(20));
  bounds.Observe(Phase::kStep, absl::Seconds(1));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(10)) << "learned floor";
  EXPECT_EQ(bounds.Bound(Phase::kFirstStep), absl::Seconds(120)) << "floor";
}

TEST(PhaseBoundsTest, AFixedBoundWinsAndInfinityMeansNever) {
  PhaseBoundsOptions options;
  options.fixed[static_cast<int>(Phase::kStep)] = absl::Seconds(2);
  options.fixed[static_cast<int>(Phase::kCheckpoint)] =
      absl::InfiniteDuration();
  PhaseBounds bounds(options);
  bounds.Observe(Phase::kStep, absl::Seconds(30));
  EXPECT_EQ(bounds.Bound(Phase::kStep), absl::Seconds(2));
  EXPECT_EQ(bounds.Bound(Phase::kCheckpoint), absl::InfiniteDuration());
}

// The default flags: a step takes ~50 ms, so a silent rank is hung after
// the step floor, and the failure names the phase.
TEST_F(SupervisorPolicyTest, SilentPastTheAdaptiveStepBoundIsHungInThatPhase) {
  common::FakeClock clock;
  PhaseBounds& bounds = Adaptive();
  SupervisorPolicy policy({.num_workers = 1}, bounds, clock);
  policy.OnRecord(0, PhaseRecord(Phase::kJoin));
  clock.Advance(absl::Seconds(1));
  policy.OnRecord(0, PhaseRecord(Phase::kStep));
  EXPECT_EQ(policy.phase(0), Phase::kFirstStep);
  for (int i = 0; i < 10; ++i) {
    clock.Advance(absl::Milliseconds(50));
    Step(policy, 0);
  }
  EXPECT_EQ(policy.phase(0), Phase::kStep);
  EXPECT_EQ(bounds.longest(Phase::kJoin), absl::Seconds(1));
  EXPECT_EQ(bounds.longest(Phase::kStep), absl::Milliseconds(50));
  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Milliseconds(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kStep);
  EXPECT_EQ(policy.failures()[0].silent, absl::Seconds(10));
  EXPECT_FALSE(policy.failures()[0].stopped);
}

// A checkpoint write is bounded by the checkpoint's bound, not a step's.
TEST_F(SupervisorPolicyTest, ACheckpointIsBoundedAsACheckpoint) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, Adaptive(), clock);
  Step(policy, 0);
  policy.OnRecord(0, PhaseRecord(Phase::kCheckpoint));
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Seconds(540));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kCheckpoint);
}

// An evaluation reported as such (ddprun-mnist's, on every rank) is bounded
// as an evaluation: a minute of it is no hang, where a step's bound is 10 s.
// It ends with the next step done, which the second step record says: rank
// 1 writes the first once its step's compute is done, then waits in the
// gradient sync for rank 0, which still evaluates.
TEST_F(SupervisorPolicyTest, AnEvaluationIsBoundedAsAnEvaluation) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(absl::Milliseconds(50));
    Step(policy, 0);
    Step(policy, 1);
  }
  policy.OnRecord(0, PhaseRecord(Phase::kEval));
  policy.OnRecord(1, PhaseRecord(Phase::kEval));
  clock.Advance(absl::Milliseconds(50));
  Step(policy, 1);  // its compute is done; it waits for rank 0
  EXPECT_EQ(policy.phase(1), Phase::kEval);
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  Step(policy, 0);
  clock.Advance(absl::Milliseconds(50));
  Step(policy, 0);
  Step(policy, 1);
  EXPECT_EQ(policy.phase(0), Phase::kStep);
  EXPECT_EQ(policy.phase(1), Phase::kStep);
  clock.Advance(absl::Seconds(10));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed) << "a step's bound again";
  EXPECT_EQ(policy.failures()[0].phase, Phase::kStep);
}

// The same for a checkpoint, which the other ranks wait for in their next
// step's sync as well.
TEST_F(SupervisorPolicyTest, TheStepAfterACheckpointEndsIt) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, Adaptive(), clock);
  Step(policy, 0);
  policy.OnRecord(0, PhaseRecord(Phase::kCheckpoint));
  Step(policy, 0);
  EXPECT_EQ(policy.phase(0), Phase::kCheckpoint);
  clock.Advance(absl::Seconds(30));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  Step(policy, 0);
  EXPECT_EQ(policy.phase(0), Phase::kStep);
}

// A stall seen in the fault harness: a survivor stopped while the round
// changes never
// reports in the new round. It is expected to (it starts in the join
// phase), and stopped, it is hung within the stopped bound.
TEST_F(SupervisorPolicyTest, ASurvivorStoppedAtARoundChangeIsHung) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 2, .in_place = {true, true}, .survivors = {true, true}},
      Adaptive(), clock);
  EXPECT_EQ(policy.phase(0), Phase::kJoin);
  policy.OnRecord(1, PhaseRecord(Phase::kJoin));
  policy.OnProcessState(0, true);
  clock.Advance(PhaseBoundsOptions{}.stopped);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 0);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kJoin);
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_EQ(decision.replace, std::vector<int>{0});
}

// Spinning instead of stopped: silent past the join bound.
TEST_F(SupervisorPolicyTest, ASilentSurvivorIsHungPastTheJoinBound) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1, .survivors = {true}}, Adaptive(),
                          clock);
  clock.Advance(absl::Seconds(119));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Seconds(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kJoin);
}

// In place, with a fixed join bound shorter than a cold start
// (--worker-timeout 2): survivors 0 and 2 wait in the join for replacement
// 1, which loads its program. They wait for it, not hang: their silence
// counts from the last local arrival, and while 1 starts, from when 1 would
// be found hung in its own start (found by CI on a loaded machine: the
// survivors holding the state were replaced).
TEST_F(SupervisorPolicyTest, SurvivorsJoiningWaitForALocalReplacementsStart) {
  common::FakeClock clock;
  PhaseBounds& bounds = Fixed(absl::Seconds(2));
  const absl::Duration start_bound = bounds.Bound(Phase::kStart);
  SupervisorPolicy policy({.num_workers = 3,
                           .expect_reports = {true, true, true},
                           .in_place = {true, false, true},
                           .survivors = {true, false, true}},
                          bounds, clock);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning) << "1 is still starting";
  policy.OnRecord(1, PhaseRecord(Phase::kJoin));
  clock.Advance(absl::Seconds(2) - absl::Milliseconds(1));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning)
      << "the join bound counts from 1's arrival";
  clock.Advance(absl::Milliseconds(1));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(policy.failures().size(), 3u) << "all three silent in the join";

  // A replacement that never arrives is the hang, found by its start
  // bound; the survivors still have their join bound past it.
  SupervisorPolicy lost({.num_workers = 2,
                         .expect_reports = {true, true},
                         .in_place = {true, false},
                         .survivors = {true, false}},
                        bounds, clock);
  clock.Advance(start_bound);
  ASSERT_EQ(lost.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(lost.failures().size(), 1u);
  EXPECT_EQ(lost.failures()[0].local_rank, 1);
  EXPECT_EQ(lost.failures()[0].phase, Phase::kStart);
  RecoveryDecision decision = lost.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});

  // Without a starting peer, a silent joiner is hung at its bound.
  SupervisorPolicy alone({.num_workers = 1, .survivors = {true}}, bounds,
                         clock);
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(alone.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(alone.failures()[0].phase, Phase::kJoin);
}

// Forming: some reporting worker may be using the round's store (starting,
// joining, syncing state); a worker that never reported is not counted.
TEST_F(SupervisorPolicyTest, FormingUntilEveryReportingWorkerSteps) {
  common::FakeClock clock;
  SupervisorPolicy policy(
      {.num_workers = 3, .expect_reports = {true, false, false}}, Adaptive(),
      clock);
  EXPECT_TRUE(policy.Forming()) << "local rank 0 is starting";
  policy.OnRecord(0, PhaseRecord(Phase::kJoin));
  policy.OnRecord(1, PhaseRecord(Phase::kJoin));
  EXPECT_TRUE(policy.Forming());
  policy.OnRecord(0, PhaseRecord(Phase::kSync));
  policy.OnRecord(1, PhaseRecord(Phase::kStep));
  EXPECT_TRUE(policy.Forming()) << "local rank 0 syncs state";
  policy.OnRecord(0, PhaseRecord(Phase::kStep));
  EXPECT_FALSE(policy.Forming())
      << "local rank 2 never reported: it shows no phase";
  SupervisorPolicy survivors({.num_workers = 1, .survivors = {true}},
                             Adaptive(), clock);
  EXPECT_TRUE(survivors.Forming()) << "a survivor starts the round joining";
  survivors.OnExit(0, ExitStatus::Exited(0));
  EXPECT_FALSE(survivors.Forming());
}

// A program that reported in an earlier round must report in this one: a
// fresh worker silent past the start-up bound is hung. One that never
// reported is left alone, as torchrun would.
TEST_F(SupervisorPolicyTest, AReportingProgramsWorkerMustReportFromItsStart) {
  common::FakeClock clock;
  SupervisorPolicy expected({.num_workers = 1, .expect_reports = {true}},
                            Adaptive(), clock);
  SupervisorPolicy unknown({.num_workers = 1}, Adaptive(), clock);
  // A Python program whose rank 0 alone reports: only local rank 0 is
  // expected to.
  SupervisorPolicy rank0_only(
      {.num_workers = 2, .expect_reports = {true, false}}, Adaptive(), clock);
  clock.Advance(absl::Seconds(120));
  ASSERT_EQ(expected.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(expected.failures()[0].phase, Phase::kStart);
  EXPECT_EQ(unknown.Evaluate(), Verdict::kRunning);
  ASSERT_EQ(rank0_only.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(rank0_only.failures().size(), 1u);
  EXPECT_EQ(rank0_only.failures()[0].local_rank, 0);
}

// A stopped worker is hung whatever it reports, or not: a Python script
// without the module too.
TEST_F(SupervisorPolicyTest, AStoppedWorkerIsHungEvenIfItNeverReports) {
  common::FakeClock clock;
  PhaseBoundsOptions options;
  options.stopped = absl::Milliseconds(100);  // --hang-bound stopped=0.1
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(options), clock);
  policy.OnProcessState(1, true);
  EXPECT_EQ(policy.NextHangDeadline(), clock.Now() + options.stopped);
  clock.Advance(options.stopped);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_TRUE(policy.failures()[0].stopped);
}

// By default a stop is a hang at the agent's first look: state T lasts until
// someone sends SIGCONT, and waiting a monitor interval more only added
// 0.1 s to every hang's recovery.
TEST_F(SupervisorPolicyTest, ByDefaultAStoppedWorkerIsHungAtTheFirstLook) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  Step(policy, 0);
  Step(policy, 1);
  policy.OnProcessState(1, true);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_TRUE(policy.failures()[0].stopped);
  EXPECT_EQ(DescribeHang(policy.failures()[0]),
            "stopped (state T) in phase step");
}

// A pause shorter than the stopped bound (SIGSTOP, then SIGCONT) is no
// hang; the next stop starts the count again.
TEST_F(SupervisorPolicyTest, APauseShorterThanTheStoppedBoundIsNoHang) {
  common::FakeClock clock;
  PhaseBoundsOptions options;
  options.stopped = absl::Milliseconds(100);  // --hang-bound stopped=0.1
  SupervisorPolicy policy({.num_workers = 1}, Adaptive(options), clock);
  const absl::Duration shorter = options.stopped * 0.8;
  policy.OnProcessState(0, true);
  clock.Advance(shorter);
  policy.OnProcessState(0, false);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnProcessState(0, true);
  clock.Advance(shorter);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  EXPECT_FALSE(policy.NextHangDeadline() == std::nullopt);
}

TEST_F(SupervisorPolicyTest, StoppedDetectionOffWithAnInfiniteBound) {
  common::FakeClock clock;
  PhaseBoundsOptions options;
  options.stopped = absl::InfiniteDuration();
  SupervisorPolicy policy({.num_workers = 1}, Adaptive(options), clock);
  policy.OnProcessState(0, true);
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
}

// A deadlock: rank 1 sleeps without using CPU while rank 0, a step ahead,
// waits for it in its sync. It is hung once the blocked bound passed (1 s
// for steps of 50 ms) since the peer got ahead, and it alone is replaced:
// rank 0 waits for it, and no other node's report is awaited.
TEST_F(SupervisorPolicyTest, AWorkerBlockedWhileAPeerWaitsForItIsHung) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
  ThreeFiguredSteps(policy, clock, 2);
  policy.OnProcessState(1, Asleep(700));
  clock.Advance(absl::Milliseconds(50));
  FiguredStep(policy, 0);  // rank 0 is a step ahead
  const absl::Time ahead = clock.Now();
  policy.OnProcessState(1, Asleep(700));
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1));
  clock.Advance(absl::Milliseconds(900));
  policy.OnProcessState(1, Asleep(700));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Milliseconds(100));
  policy.OnProcessState(1, Asleep(700));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  const LocalFailure& f = policy.failures()[0];
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_TRUE(f.blocked);
  EXPECT_FALSE(f.stopped);
  EXPECT_EQ(f.waited_by, 0);
  EXPECT_EQ(f.silent, absl::Seconds(1));
  EXPECT_EQ(DescribeHang(f),
            "blocked for 1s in phase step: asleep without using CPU while "
            "local rank 0 waited for it (a deadlock, or a wait that does not "
            "end; --hang-bound blocked=SECONDS changes the bound)");
  EXPECT_FALSE(policy.AwaitsRemoteCause(2));
  const RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

// An agent stopped for 2 s (the soak's agent-pause) reads its workers'
// records late: the time between two records is then its own delay, not a
// step's. The blocked bound follows what each record says its step
// computed (10 ms here), so a deadlock after that is still found after 1 s.
// Bounded by the time between records it took 10 s (5 x that 2 s), and
// the soak's deadlocks after an agent-pause waited the step's 10 s bound.
TEST_F(SupervisorPolicyTest, AnAgentsStallDoesNotWidenTheBlockedBound) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
  ThreeFiguredSteps(policy, clock, 2);
  clock.Advance(absl::Seconds(2));  // the agent was stopped
  for (int i = 0; i < 2; ++i) FiguredStep(policy, i);
  clock.Advance(absl::Milliseconds(50));
  for (int i = 0; i < 2; ++i) FiguredStep(policy, i);
  policy.OnProcessState(1, Asleep(700));
  clock.Advance(absl::Milliseconds(50));
  FiguredStep(policy, 0);  // rank 0 is a step ahead
  const absl::Time ahead = clock.Now();
  policy.OnProcessState(1, Asleep(700));
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1));
}

// A survivor's step record of the round before, read at this round's
// start, does not put it ahead: steps count from each rank's "phase step"
// of the round. Else a replacement blocked after its first step was two
// behind, no lockstep, and the survivor and it were both killed at the
// step's bound (a soak's 20 s).
TEST_F(SupervisorPolicyTest, StepsCountFromTheRoundsStartOfStepping) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2,
                           .expect_reports = {true, true},
                           .in_place = {true, true},
                           .survivors = {true, false},
                           .figured_steps = true},
                          Adaptive(), clock);
  FiguredStep(policy, 0);  // the round before's last step, read late
  for (int i = 0; i < 2; ++i) {
    policy.OnRecord(i, PhaseRecord(Phase::kJoin));
    policy.OnRecord(i, PhaseRecord(Phase::kSync));
    policy.OnRecord(i, PhaseRecord(Phase::kStep));
    FiguredStep(policy, i);
  }
  policy.OnProcessState(1, Asleep(500));
  FiguredStep(policy, 0);  // a step ahead: it waits for rank 1
  const absl::Time ahead = clock.Now();
  clock.Advance(absl::Milliseconds(100));
  policy.OnProcessState(1, Asleep(500));
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Milliseconds(1100));
  clock.Advance(absl::Seconds(1));
  policy.OnProcessState(1, Asleep(500));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_TRUE(policy.failures()[0].blocked);
}

// Ranks 0 and 2 are a step ahead of rank 1, waiting for it in their sync,
// just past an evaluation (rank 1 recorded the one step after it, which
// leaves a rank in the phase). Their silence is rank 1's: they are not hung
// at the step's bound, and rank 1, which computes a step now (a peer is
// ahead: it waits for nobody evaluating), is bounded as a step, not as the
// evaluation. Before, ranks 0 and 2 were killed at 10 s and rank 1 kept.
TEST_F(SupervisorPolicyTest, RanksAStepAheadWaitForTheOneBehind) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, Adaptive(), clock);
  for (int i = 0; i < 3; ++i) policy.OnInPlaceDeclared(i);
  ThreeFiguredSteps(policy, clock, 3);
  for (int i = 0; i < 3; ++i) policy.OnRecord(i, PhaseRecord(Phase::kEval));
  clock.Advance(absl::Milliseconds(50));
  for (int i = 0; i < 3; ++i) FiguredStep(policy, i);  // the step after
  clock.Advance(absl::Milliseconds(50));
  FiguredStep(policy, 0);
  FiguredStep(policy, 2);
  EXPECT_EQ(policy.phase(1), Phase::kEval);
  int cpu_ms = 700;
  for (int look = 0; look < 99; ++look) {  // busy: a spin, not blocked
    clock.Advance(absl::Milliseconds(100));
    policy.OnProcessState(1, Asleep(cpu_ms += 10));
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
  }
  clock.Advance(absl::Milliseconds(200));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 1);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kStep);
  EXPECT_FALSE(policy.failures()[0].blocked);
  EXPECT_FALSE(policy.AwaitsRemoteCause(2)) << "its local peers wait for it";
  const RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
}

// A survivor blocked before a round change (a deadlock) cannot take the
// next round: it writes nothing, while its local peer, told the round at
// the same moment, reports its join and waits for it there. It is blocked,
// hung after the blocked bound; before, every survivor waited out the
// join's bound (30 s), twice in a job of several nodes.
TEST_F(SupervisorPolicyTest, ASurvivorThatDoesNotTakeTheRoundIsBlocked) {
  const SupervisorPolicyOptions options = {.num_workers = 2,
                                           .in_place = {true, true},
                                           .survivors = {true, true},
                                           .figured_steps = true};
  common::FakeClock clock;
  SupervisorPolicy policy(options, Adaptive(), clock);
  policy.OnProcessState(0, Asleep(900));
  clock.Advance(absl::Milliseconds(100));
  policy.OnProcessState(0, Asleep(900));  // idle from here
  clock.Advance(absl::Milliseconds(10));
  policy.OnRecord(1, PhaseRecord(Phase::kJoin));  // it took the round
  const absl::Time joined = clock.Now();
  for (int look = 0; look < 9; ++look) {
    clock.Advance(absl::Milliseconds(100));
    policy.OnProcessState(0, Asleep(900));
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
  }
  clock.Advance(absl::Milliseconds(100));
  policy.OnProcessState(0, Asleep(900));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].local_rank, 0);
  EXPECT_TRUE(policy.failures()[0].blocked);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kJoin);
  EXPECT_EQ(policy.failures()[0].time, joined + absl::Seconds(1));
  EXPECT_FALSE(policy.AwaitsRemoteCause(2));
  EXPECT_EQ(policy.DecideRecovery().replace, std::vector<int>{0});

  // The waiting peer a replacement (CI's fault_harness_block_test: a
  // worker killed to open the round change, replaced fresh): the same.
  common::FakeClock clock3;
  SupervisorPolicy fresh({.num_workers = 2,
                          .expect_reports = {true, true},
                          .in_place = {true, true},
                          .survivors = {true, false},
                          .figured_steps = true},
                         Adaptive(), clock3);
  fresh.OnProcessState(0, Asleep(900));
  clock3.Advance(absl::Milliseconds(100));
  fresh.OnProcessState(0, Asleep(900));
  fresh.OnRecord(1, {.kind = ProgressRecord::Kind::kInPlace});
  clock3.Advance(absl::Milliseconds(300));  // its start: not waiting yet
  fresh.OnProcessState(0, Asleep(900));
  fresh.OnRecord(1, PhaseRecord(Phase::kJoin));
  EXPECT_EQ(fresh.NextHangDeadline(), clock3.Now() + absl::Seconds(1));
  clock3.Advance(absl::Seconds(1));
  fresh.OnProcessState(0, Asleep(900));
  ASSERT_EQ(fresh.Evaluate(), Verdict::kFailed);
  EXPECT_EQ(fresh.failures()[0].local_rank, 0);
  EXPECT_TRUE(fresh.failures()[0].blocked);

  // Both silent in the join (neither took the round yet, or both did and
  // wait for another node): nobody is blocked.
  for (bool took : {false, true}) {
    common::FakeClock clock2;
    SupervisorPolicy both(options, Adaptive(), clock2);
    if (took) {
      both.OnRecord(0, PhaseRecord(Phase::kJoin));
      both.OnRecord(1, PhaseRecord(Phase::kJoin));
    }
    for (int look = 0; look < 50; ++look) {
      clock2.Advance(absl::Milliseconds(100));
      both.OnProcessState(0, Asleep(900));
      both.OnProcessState(1, Asleep(800));
      ASSERT_EQ(both.Evaluate(), Verdict::kRunning) << look << took;
    }
  }
}

// A collective of the state sync, entered (libddp's record).
void EnterCollective(SupervisorPolicy& policy, int local_rank) {
  policy.OnRecord(local_rank, {.kind = ProgressRecord::Kind::kCollective});
}
// A collective of the state sync, entered and completed.
void Collective(SupervisorPolicy& policy, int local_rank) {
  EnterCollective(policy, local_rank);
  policy.OnRecord(local_rank, {.kind = ProgressRecord::Kind::kCollectiveDone});
}

// A deadlock in the state sync: every rank makes the sync's collectives in
// the same order, so a local peer that entered more of them (or finished the
// sync and stepped on) waits for the rank that did not. Asleep without
// using CPU meanwhile, that rank is blocked after 1 s, not at the sync's
// bound (120 s, 30 s once learned), and it alone is replaced.
TEST_F(SupervisorPolicyTest, ADeadlockInTheStateSyncIsFoundBlocked) {
  for (const bool peer_finished : {false, true}) {
    SCOPED_TRACE(peer_finished ? "the peer finished the sync"
                               : "the peer entered the next collective");
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2,
                             .expect_reports = {true, true},
                             .in_place = {true, true},
                             .survivors = {true, false},
                             .figured_steps = true},
                            Adaptive(), clock);
    for (int i = 0; i < 2; ++i) {
      policy.OnRecord(i, PhaseRecord(Phase::kJoin));
      policy.OnRecord(i, PhaseRecord(Phase::kSync));
      for (int c = 0; c < 3; ++c) Collective(policy, i);
    }
    policy.OnProcessState(1, Asleep(900));
    clock.Advance(absl::Milliseconds(20));
    // Rank 1 stops in the program's own code between two collectives.
    if (peer_finished) {
      policy.OnRecord(0, PhaseRecord(Phase::kStep));
    } else {
      EnterCollective(policy, 0);
    }
    const absl::Time ahead = clock.Now();
    policy.OnProcessState(1, Asleep(900));
    EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1));
    clock.Advance(absl::Milliseconds(900));
    policy.OnProcessState(1, Asleep(900));
    EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
    clock.Advance(absl::Milliseconds(100));
    policy.OnProcessState(1, Asleep(900));
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    const LocalFailure& f = policy.failures()[0];
    EXPECT_EQ(f.local_rank, 1);
    EXPECT_TRUE(f.blocked);
    EXPECT_EQ(f.phase, Phase::kSync);
    EXPECT_EQ(f.waited_by, 0);
    EXPECT_EQ(DescribeHang(f),
              "blocked for 1s in phase sync: asleep without using CPU while "
              "local rank 0 waited for it (a deadlock, or a wait that does "
              "not end; --hang-bound blocked=SECONDS changes the bound)");
    EXPECT_FALSE(policy.AwaitsRemoteCause(2));
    const RecoveryDecision decision = policy.DecideRecovery();
    EXPECT_TRUE(decision.in_place);
    EXPECT_EQ(decision.replace, std::vector<int>{1});
  }
}

// In the sync, nobody is blocked while no local peer is past it: both
// waiting in the same collective (for a rank of another node), a rank
// behind that uses CPU (it receives a large model), or one behind a peer
// that left the sync only to end (it exited). Nor is one inside a
// collective, whatever its peer did: a broadcast relayed through a rank of
// another node that deadlocked before it completed on the peer and not here
// (in a soak, that innocent rank was killed, and the culprit found after).
TEST_F(SupervisorPolicyTest, OnlyARankBehindInTheSyncAndIdleIsBlocked) {
  struct Case {
    const char* what;
    bool peer_ahead = true;
    int cpu_ms_per_look = 0;
    bool peer_exits = false;
    bool inside = false;  // rank 1 entered the next collective, not done
  };
  const std::vector<Case> cases = {
      {"in the same collective", /*peer_ahead=*/false},
      {"receiving", true, /*cpu_ms_per_look=*/10},
      {"the peer ahead ended", true, 0, /*peer_exits=*/true},
      {"inside a collective the peer finished", true, 0, false,
       /*inside=*/true},
  };
  for (const Case& c : cases) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2,
                             .expect_reports = {true, true},
                             .in_place = {true, true},
                             .survivors = {true, true},
                             .figured_steps = true},
                            Adaptive(), clock);
    for (int i = 0; i < 2; ++i) {
      policy.OnRecord(i, PhaseRecord(Phase::kJoin));
      policy.OnRecord(i, PhaseRecord(Phase::kSync));
      Collective(policy, i);
    }
    if (c.inside) {
      EnterCollective(policy, 1);
      Collective(policy, 0);
      policy.OnRecord(0, PhaseRecord(Phase::kStep));
    } else if (c.peer_ahead) {
      EnterCollective(policy, 0);
    } else {
      for (int i = 0; i < 2; ++i) EnterCollective(policy, i);
    }
    if (c.peer_exits) policy.OnExit(0, ExitStatus::Exited(0));
    int cpu_ms = 900;
    for (int look = 0; look < 50; ++look) {  // 5 s of looks
      policy.OnProcessState(1, Asleep(cpu_ms));
      if (!c.peer_exits) policy.OnProcessState(0, Asleep(800));
      cpu_ms += c.cpu_ms_per_look;
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << c.what;
      clock.Advance(absl::Milliseconds(100));
    }
  }
}

// A node's only rank deadlocked in the state sync: no local peer is past
// it, but the server answers that a rank of the round entered more of the
// sync's collectives, or finished the sync (OnRoundSync). It is blocked 1 s
// after that rank got there, as the answer dates it, and it is the cause.
// Level with the round, inside a collective, or receiving (using CPU), it
// is not.
TEST_F(SupervisorPolicyTest, ANodesOnlyRankDeadlockedInTheSyncIsFoundBlocked) {
  struct Case {
    const char* what;
    int64_t round_sync;  // the rank entered 2 collectives and completed them
    bool inside = false;
    int cpu_ms_per_look = 0;
    bool blocked;
  };
  const std::vector<Case> cases = {
      // 3 both ways: each collective entered, and leaving the sync.
      {"a rank entered the next collective, or finished the sync", 3, false, 0,
       true},
      {"a rank further on", 5, false, 0, true},
      {"level with the round", 2, false, 0, false},
      {"inside the next collective", 3, /*inside=*/true, 0, false},
      {"receiving", 3, false, /*cpu_ms_per_look=*/10, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 1,
                             .expect_reports = {true},
                             .in_place = {true},
                             .survivors = {true},
                             .figured_steps = true,
                             .multi_node = true},
                            Adaptive(), clock);
    policy.OnRecord(0, PhaseRecord(Phase::kJoin));
    policy.OnRecord(0, PhaseRecord(Phase::kSync));
    for (int i = 0; i < 2; ++i) Collective(policy, 0);
    if (c.inside) EnterCollective(policy, 0);
    int cpu_ms = 900;
    auto look = [&] {
      policy.OnProcessState(0, Asleep(cpu_ms));
      cpu_ms += c.cpu_ms_per_look;
    };
    look();
    clock.Advance(absl::Milliseconds(100));
    look();
    // Another node's rank got there 300 ms before the answer came.
    const absl::Time ahead = clock.Now();
    clock.Advance(absl::Milliseconds(300));
    policy.OnRoundSync(c.round_sync, ahead);
    look();
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning);
    if (!c.blocked) {
      for (int i = 0; i < 50; ++i) {  // 5 s of looks
        clock.Advance(absl::Milliseconds(100));
        look();
        ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << i;
      }
      continue;
    }
    EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1));
    clock.Advance(absl::Milliseconds(600));
    look();
    EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
    clock.Advance(absl::Milliseconds(100));
    look();
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    const LocalFailure& f = policy.failures()[0];
    EXPECT_TRUE(f.blocked);
    EXPECT_EQ(f.phase, Phase::kSync);
    EXPECT_EQ(f.waited_by, -1);
    EXPECT_THAT(DescribeHang(f),
                ::testing::HasSubstr("blocked for 1s in phase sync"));
    EXPECT_THAT(DescribeHang(f),
                ::testing::HasSubstr("while a rank of another node waited "
                                     "for it"));
    EXPECT_FALSE(policy.AwaitsRemoteCause(2));
    const RecoveryDecision decision = policy.DecideRecovery();
    EXPECT_TRUE(decision.in_place);
    EXPECT_EQ(decision.replace, std::vector<int>{0});
  }
}

// A deadlocked rank's other threads (Gloo's, gRPC's) wake now and then, and
// /proc charges CPU in ticks of 10 ms: one stray tick 0.8 s into the wait
// does not start the blocked bound again (the fault harness found such a
// rank after 1.9 s instead of 1.1 s). A tick at every third look (a rank
// whose own threads do some work while it waits for them) is no deadlock.
TEST_F(SupervisorPolicyTest, AStrayTickLeavesADeadlockedRankBlocked) {
  for (const bool steady : {false, true}) {
    SCOPED_TRACE(steady ? "a tick every third look" : "one stray tick");
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
    ThreeFiguredSteps(policy, clock, 2);
    policy.OnProcessState(1, Asleep(700));
    FiguredStep(policy, 0);  // rank 0 a step ahead: it waits for rank 1
    int cpu_ms = 700;
    for (int look = 0; look <= 50; ++look) {
      if (steady ? look % 3 == 2 : look == 8) cpu_ms += 10;
      policy.OnProcessState(1, Asleep(cpu_ms));
      if (!steady && look == 10) break;
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      clock.Advance(absl::Milliseconds(100));
    }
    if (steady) continue;
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    EXPECT_TRUE(policy.failures()[0].blocked);
    EXPECT_EQ(policy.failures()[0].local_rank, 1);
  }
}

// The same rank blocked instead (ddprun-mnist's first step after its
// evaluation, then a deadlock): found blocked after 1 s, and named in the
// phase it is judged in, the step, not the evaluation it left.
TEST_F(SupervisorPolicyTest, BlockedJustPastAnEvaluationIsBlockedInAStep) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
  ThreeFiguredSteps(policy, clock, 2);
  for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(Phase::kEval));
  for (int i = 0; i < 2; ++i) FiguredStep(policy, i);  // the step after
  policy.OnProcessState(1, Asleep(700));
  FiguredStep(policy, 0);
  for (int look = 0; look <= 10; ++look) {
    policy.OnProcessState(1, Asleep(700));
    if (look < 10) ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
    clock.Advance(absl::Milliseconds(100));
  }
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_TRUE(policy.failures()[0].blocked);
  EXPECT_EQ(policy.failures()[0].phase, Phase::kStep);
  EXPECT_EQ(policy.phase(1), Phase::kEval);
}

// A deadlock inside a checkpoint write: rank 0 reported the checkpoint and
// sleeps without using CPU, while rank 1, with nothing to write, did its
// next step and waits for rank 0 in that step's sync. Rank 0 is found
// blocked in the checkpoint, not at the checkpoint's own bound (30 s once
// learned, 600 s before): after 1 s, since its earlier write took 200 ms
// (5 x 200 ms), or 10 s in its first checkpoint of the job, where nothing
// says yet how long its writes sleep (a checkpoint sent to a store over a
// socket sleeps too).
TEST_F(SupervisorPolicyTest, ADeadlockInACheckpointWriteIsFoundBlocked) {
  for (bool first : {false, true}) {
    SCOPED_TRACE(first ? "the rank's first checkpoint" : "a later one");
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2, .first_rank = 4}, Adaptive(),
                            clock);
    for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
    ThreeFiguredSteps(policy, clock, 2);
    if (!first) {  // a checkpoint of 200 ms on rank 4, ended by two steps
      for (int i = 0; i < 2; ++i) {
        policy.OnRecord(i, PhaseRecord(Phase::kCheckpoint));
      }
      clock.Advance(absl::Milliseconds(200));
      for (int step = 0; step < 2; ++step) {
        for (int i = 0; i < 2; ++i) FiguredStep(policy, i);
        clock.Advance(absl::Milliseconds(50));
      }
    }
    for (int i = 0; i < 2; ++i) {
      policy.OnRecord(i, PhaseRecord(Phase::kCheckpoint));
    }
    policy.OnProcessState(0, Asleep(700));
    clock.Advance(absl::Milliseconds(50));
    FiguredStep(policy, 1);  // rank 5's step after the checkpoint
    const absl::Time ahead = clock.Now();
    const absl::Duration bound = first ? absl::Seconds(10) : absl::Seconds(1);
    policy.OnProcessState(0, Asleep(700));
    EXPECT_EQ(policy.NextHangDeadline(), ahead + bound);
    const int looks = static_cast<int>(bound / absl::Milliseconds(100));
    for (int look = 1; look <= looks; ++look) {
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      clock.Advance(absl::Milliseconds(100));
      policy.OnProcessState(0, Asleep(700));
    }
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    const LocalFailure& f = policy.failures()[0];
    EXPECT_EQ(f.local_rank, 0);
    EXPECT_TRUE(f.blocked);
    EXPECT_EQ(f.phase, Phase::kCheckpoint);
    EXPECT_EQ(f.waited_by, 1);
    EXPECT_EQ(f.silent, bound);
    EXPECT_THAT(
        DescribeHang(f),
        ::testing::StartsWith("blocked for " + absl::FormatDuration(bound) +
                              " in phase checkpoint: asleep without "
                              "using CPU while local rank 1 waited"));
    const RecoveryDecision decision = policy.DecideRecovery();
    EXPECT_TRUE(decision.in_place);
    EXPECT_EQ(decision.replace, std::vector<int>{0});
  }
}

// A look at a process asleep with `cpu_ms` of CPU used, `io` bytes moved
// (ProcessState::io) and no child process.
ProcessState Quiet(int cpu_ms, uint64_t io) {
  return {.state = 'S',
          .cpu = absl::Milliseconds(cpu_ms),
          .io = io,
          .has_children = false};
}

// A deadlock in the writer's first checkpoint of the job, found quiet:
// asleep, no CPU used, nothing read or written and no child process, while
// rank 1 waits for it a step ahead. Then no upload or copy is under way,
// and the quiet floor (0.5 s) is its bound, not the 10 s a first
// checkpoint is given (a checkpoint sent over a socket sleeps). Once found
// so, the rank's next first checkpoint (it was never seen to end one) is
// given the 10 s: a wait the looks cannot see would otherwise cost every
// attempt.
TEST_F(SupervisorPolicyTest, ADeadlockInARanksFirstCheckpointIsFoundQuiet) {
  PhaseBounds& bounds = Adaptive();
  for (absl::Duration bound : {absl::Milliseconds(500), absl::Seconds(10)}) {
    SCOPED_TRACE(absl::FormatDuration(bound));
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, bounds, clock);
    for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
    ThreeFiguredSteps(policy, clock, 2);
    for (int i = 0; i < 2; ++i) {
      policy.OnRecord(i, PhaseRecord(Phase::kCheckpoint));
    }
    policy.OnProcessState(0, Quiet(700, 5000));
    clock.Advance(absl::Milliseconds(50));
    FiguredStep(policy, 1);
    const absl::Time ahead = clock.Now();
    policy.OnProcessState(0, Quiet(700, 5000));
    EXPECT_EQ(policy.NextHangDeadline(), ahead + bound);
    const int looks = static_cast<int>(bound / absl::Milliseconds(100));
    for (int look = 1; look <= looks; ++look) {
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      clock.Advance(absl::Milliseconds(100));
      policy.OnProcessState(0, Quiet(700, 5000));
    }
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    const LocalFailure& f = policy.failures()[0];
    EXPECT_TRUE(f.blocked);
    EXPECT_EQ(f.quiet, bound == absl::Milliseconds(500));
    EXPECT_EQ(f.first_time, f.quiet);
    EXPECT_EQ(f.phase, Phase::kCheckpoint);
    EXPECT_EQ(f.waited_by, 1);
    EXPECT_EQ(f.silent, bound);
    if (f.quiet) {
      EXPECT_THAT(DescribeHang(f),
                  ::testing::StartsWith(
                      "blocked for 500ms in phase checkpoint: asleep without "
                      "using CPU while local rank 1 waited for it, and quiet "
                      "(no bytes read or written, no child process) the "
                      "first time this rank was there"));
    }
    EXPECT_EQ(policy.DecideRecovery().replace, std::vector<int>{0});
  }
}

// In the writer's first checkpoint, a wait that is not quiet is given the
// 10 s of a first checkpoint: one whose I/O moves (an upload, a copy), one
// with a child process (a program it runs to copy the file), one whose I/O
// is not known, and any with a fixed blocked bound.
TEST_F(SupervisorPolicyTest, AFirstCheckpointThatIsNotQuietIsGivenItsFloor) {
  struct Case {
    const char* what;
    std::function<ProcessState(int look)> state;
    PhaseBoundsOptions options;
  };
  PhaseBoundsOptions fixed;
  fixed.blocked_fixed = absl::Seconds(4);
  const std::vector<Case> cases = {
      {"I/O moves", [](int look) { return Quiet(700, 5000 + look); }, {}},
      {"a child process",
       [](int) {
         ProcessState s = Quiet(700, 5000);
         s.has_children = true;
         return s;
       },
       {}},
      {"I/O unknown", [](int) { return Asleep(700); }, {}},
      {"a fixed bound", [](int) { return Quiet(700, 5000); }, fixed},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(c.options), clock);
    ThreeFiguredSteps(policy, clock, 2);
    for (int i = 0; i < 2; ++i) {
      policy.OnRecord(i, PhaseRecord(Phase::kCheckpoint));
    }
    policy.OnProcessState(0, c.state(0));
    clock.Advance(absl::Milliseconds(50));
    FiguredStep(policy, 1);
    const absl::Time ahead = clock.Now();
    const absl::Duration bound =
        c.options.blocked_fixed.value_or(absl::Seconds(10));
    const int looks = static_cast<int>(bound / absl::Milliseconds(100));
    for (int look = 1; look <= looks; ++look) {
      policy.OnProcessState(0, c.state(look));
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      clock.Advance(absl::Milliseconds(100));
    }
    policy.OnProcessState(0, c.state(looks + 1));
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    EXPECT_FALSE(policy.failures()[0].quiet);
    EXPECT_GE(clock.Now() - ahead, bound);
  }
}

// A deadlock in a step, quiet: found after the quiet floor (0.5 s), or 5x
// the costliest step's compute when that is longer, not the blocked floor
// (1 s). One whose I/O moves, or that has a child process, waits for
// something under way: it is given the blocked floor.
TEST_F(SupervisorPolicyTest, AQuietDeadlockInAStepIsFoundAfterHalfASecond) {
  struct Case {
    const char* what;
    std::function<ProcessState(int look)> state;
    double compute_seconds = 0.01;
    absl::Duration bound;
    bool quiet = true;
  };
  const std::vector<Case> cases = {
      {"quiet", [](int) { return Quiet(700, 5000); }, 0.01,
       absl::Milliseconds(500)},
      {"quiet, steps of 160 ms", [](int) { return Quiet(700, 5000); }, 0.16,
       absl::Milliseconds(800)},
      {"I/O moves", [](int look) { return Quiet(700, 5000 + look); }, 0.01,
       absl::Seconds(1), false},
      {"a child process",
       [](int) {
         ProcessState s = Quiet(700, 5000);
         s.has_children = true;
         return s;
       },
       0.01, absl::Seconds(1), false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
    for (int step = 0; step < 3; ++step) {
      clock.Advance(absl::Milliseconds(50));
      for (int i = 0; i < 2; ++i) {
        policy.OnRecord(i, {.kind = ProgressRecord::Kind::kStep,
                            .compute_seconds = c.compute_seconds});
      }
    }
    policy.OnProcessState(1, c.state(0));
    clock.Advance(absl::Milliseconds(50));
    FiguredStep(policy, 0);  // rank 0 waits for rank 1 in its sync
    const absl::Time ahead = clock.Now();
    const int looks = static_cast<int>(c.bound / absl::Milliseconds(100));
    for (int look = 1; look <= looks; ++look) {
      policy.OnProcessState(1, c.state(look));
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      clock.Advance(absl::Milliseconds(100));
    }
    policy.OnProcessState(1, c.state(looks + 1));
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
    ASSERT_EQ(policy.failures().size(), 1u);
    const LocalFailure& f = policy.failures()[0];
    EXPECT_EQ(f.local_rank, 1);
    EXPECT_TRUE(f.blocked);
    EXPECT_EQ(f.quiet, c.quiet);
    EXPECT_FALSE(f.first_time);
    EXPECT_EQ(f.phase, Phase::kStep);
    EXPECT_EQ(clock.Now() - ahead, c.bound);
    if (c.quiet) {
      EXPECT_THAT(DescribeHang(f),
                  ::testing::HasSubstr(
                      "while local rank 0 waited for it, and quiet (no bytes "
                      "read or written, no child process) (a deadlock"));
    }
  }
}

// Rank 0 evaluates while rank 1, a step ahead, waits for it: an
// evaluation uses CPU, and one that sleeps (reading the test set) does so
// within 5x its longest; neither is blocked. Nor is a rank in an
// evaluation that no peer waits for yet.
TEST_F(SupervisorPolicyTest, AnEvaluationThatWorksOrWaitsAloneIsNotBlocked) {
  struct Case {
    const char* what;
    int cpu_ms_per_look = 0;
    bool peer_ahead = true;
  };
  for (const Case& c : {Case{"busy", 10}, Case{"nobody waits", 0, false}}) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
    ThreeFiguredSteps(policy, clock, 2);
    for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(Phase::kEval));
    if (c.peer_ahead) FiguredStep(policy, 1);
    int cpu_ms = 700;
    for (int look = 0; look < 150; ++look) {  // 15 s of looks
      policy.OnProcessState(0, Asleep(cpu_ms += c.cpu_ms_per_look));
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << c.what << look;
      clock.Advance(absl::Milliseconds(100));
    }
  }
  // A slow evaluation seen before (4 s, asleep): 20 s asleep is its bound.
  PhaseBounds& bounds = Adaptive();
  bounds.Observe(Phase::kEval, absl::Seconds(4), /*rank=*/0);
  EXPECT_EQ(bounds.BlockedBound(Phase::kEval, 0), absl::Seconds(20));
}

// Rank 1 waited in its sync through rank 0's 30 s evaluation, silent. Once
// rank 0 is a step ahead, rank 1 computes a step, bounded as one, but from
// then: its silence through the evaluation does not count (CI's
// E2eTest.AnEvaluationLongerThanTheStepBoundIsNoHang killed it at once).
TEST_F(SupervisorPolicyTest, AStepAfterAWaitIsTimedFromTheWaitsEnd) {
  common::FakeClock clock;
  PhaseBoundsOptions options;
  options.fixed[static_cast<int>(Phase::kStep)] = absl::Seconds(2);
  SupervisorPolicy policy({.num_workers = 2}, Adaptive(options), clock);
  ThreeFiguredSteps(policy, clock, 2);
  for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(Phase::kEval));
  FiguredStep(policy, 1);  // rank 1 waits for rank 0's evaluation
  clock.Advance(absl::Seconds(30));
  FiguredStep(policy, 0);  // rank 0's step after its evaluation
  clock.Advance(absl::Milliseconds(50));
  FiguredStep(policy, 0);  // a step ahead: the sync rank 1 waited in is over
  const absl::Time ahead = clock.Now();
  int cpu_ms = 100;
  for (int look = 0; look < 19; ++look) {
    policy.OnProcessState(1, Asleep(cpu_ms += 10));  // busy computing
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
    clock.Advance(absl::Milliseconds(100));
  }
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(2));
}

// What is not blocked: a rank that uses CPU (an evaluation it does not
// report, a spin), one in disk sleep (state D), one no peer waits for, one
// whose records carry no compute figure (a Python program's progress.step()
// may come after its sync), and any with --hang-bound blocked=0. Each is
// bounded as a silent step instead.
TEST_F(SupervisorPolicyTest, OnlyAnIdleRankAPeerWaitsForIsBlocked) {
  struct Case {
    const char* what;
    char state = 'S';  // at every look
    int cpu_ms_per_look = 0;
    bool peer_ahead = true;
    bool figured = true;
    PhaseBoundsOptions options;
  };
  PhaseBoundsOptions never;
  never.blocked_fixed = absl::InfiniteDuration();
  const std::vector<Case> cases = {
      {"busy", 'S', /*cpu_ms_per_look=*/10},
      {"disk sleep", 'D'},
      {"running", 'R'},
      {"nobody waits", 'S', 0, /*peer_ahead=*/false},
      {"no figures", 'S', 0, true, /*figured=*/false},
      {"--hang-bound blocked=0", 'S', 0, true, true, never},
  };
  for (const Case& c : cases) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(c.options), clock);
    for (int step = 0; step < 3; ++step) {
      clock.Advance(absl::Milliseconds(50));
      for (int i = 0; i < 2; ++i) {
        c.figured ? FiguredStep(policy, i) : Step(policy, i);
      }
    }
    if (c.peer_ahead) c.figured ? FiguredStep(policy, 0) : Step(policy, 0);
    int cpu_ms = 700;
    for (int look = 0; look < 50; ++look) {  // 5 s of looks
      policy.OnProcessState(
          1, {.state = c.state, .cpu = absl::Milliseconds(cpu_ms)});
      cpu_ms += c.cpu_ms_per_look;
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << c.what;
      clock.Advance(absl::Milliseconds(100));
    }
  }
}

// A round's first step records carry no compute figure (libddp has no
// previous sync to measure from): what an earlier round showed of the
// program (the agent's figured_steps) lets a worker blocked right after its
// first step be found too.
TEST_F(SupervisorPolicyTest, AnEarlierRoundsFiguresCountForTheFirstSteps) {
  for (bool earlier : {false, true}) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2, .figured_steps = earlier},
                            Adaptive(), clock);
    Step(policy, 0);
    Step(policy, 1);
    EXPECT_EQ(policy.figured_steps(), earlier);
    policy.OnProcessState(1, Asleep(700));
    Step(policy, 0);
    for (int look = 0; look < 20; ++look) {
      clock.Advance(absl::Milliseconds(100));
      policy.OnProcessState(1, Asleep(700));
    }
    EXPECT_EQ(policy.Evaluate(), earlier ? Verdict::kFailed : Verdict::kRunning)
        << "figured_steps " << earlier;
  }
}

// A look at a process running (state R) with `cpu_ms` of CPU used.
ProcessState Running(int cpu_ms) {
  return {.state = 'R', .cpu = absl::Milliseconds(cpu_ms)};
}

// A spin: rank 1 runs on one core without finishing its step while rank 0,
// a step ahead, waits for it. The program reports its evaluations, so work
// between steps is not taken for a spin: rank 1 is hung once it used the
// spin bound (1 s of CPU for steps that cost little) since rank 0 got
// ahead, and it alone is replaced.
TEST_F(SupervisorPolicyTest, ARankThatSpinsWhileAPeerWaitsForItIsHung) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2, .reports_between_steps = true},
                          Adaptive(), clock);
  for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
  ThreeFiguredSteps(policy, clock, 2);
  policy.OnProcessState(1, Running(700));
  clock.Advance(absl::Milliseconds(50));
  FiguredStep(policy, 0);  // rank 0 is a step ahead
  const absl::Time ahead = clock.Now();
  int cpu_ms = 700;
  policy.OnProcessState(1, Running(cpu_ms));
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1))
      << "a second of CPU from this look on, at one core";
  for (int look = 0; look < 9; ++look) {
    clock.Advance(absl::Milliseconds(100));
    cpu_ms += 100;
    policy.OnProcessState(1, Running(cpu_ms));
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
  }
  clock.Advance(absl::Milliseconds(100));
  cpu_ms += 100;
  policy.OnProcessState(1, Running(cpu_ms));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  const LocalFailure& f = policy.failures()[0];
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_TRUE(f.spinning);
  EXPECT_FALSE(f.blocked);
  EXPECT_EQ(f.waited_by, 0);
  EXPECT_EQ(f.cpu, absl::Seconds(1));
  EXPECT_EQ(f.silent, absl::Seconds(1));
  EXPECT_EQ(DescribeHang(f),
            "spinning for 1s in phase step: used 1s of CPU without finishing "
            "its step while local rank 0 waited for it (a loop that does not "
            "end; --hang-bound spin=SECONDS changes the bound)");
  EXPECT_FALSE(policy.AwaitsRemoteCause(2));
  const RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

// A spin in a checkpoint write or an evaluation the program reported, on
// the rank that writes or evaluates (global rank 4), while rank 5 waits for
// it a step ahead. Its earlier such phase used 400 ms of CPU, from the look
// before it began to the first after the step that ended it; so 5 x that,
// 2 s of CPU, is its bound there. The first time the rank is in the phase,
// nothing bounds its CPU but the phase's own bound: a first evaluation of a
// large model may take minutes of CPU.
TEST_F(SupervisorPolicyTest,
       ASpinInACheckpointOrEvaluationIsFoundByTheRanksOwnCpu) {
  for (Phase phase : {Phase::kCheckpoint, Phase::kEval}) {
    for (bool first : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(common::PhaseName(phase),
                       first ? ", the rank's first" : ", a later one"));
      common::FakeClock clock;
      SupervisorPolicy policy({.num_workers = 2, .first_rank = 4}, Adaptive(),
                              clock);
      for (int i = 0; i < 2; ++i) policy.OnInPlaceDeclared(i);
      ThreeFiguredSteps(policy, clock, 2);
      int cpu_ms = 700;
      policy.OnProcessState(0, Running(cpu_ms));
      if (!first) {  // 300 ms of work on rank 4, then two steps
        for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(phase));
        for (int look = 0; look < 3; ++look) {
          clock.Advance(absl::Milliseconds(100));
          policy.OnProcessState(0, Running(cpu_ms += 100));
        }
        for (int step = 0; step < 2; ++step) {
          for (int i = 0; i < 2; ++i) FiguredStep(policy, i);
          clock.Advance(absl::Milliseconds(50));
          policy.OnProcessState(0, Running(cpu_ms += 50));
        }
        ASSERT_EQ(policy.Evaluate(), Verdict::kRunning);
      }
      for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(phase));
      clock.Advance(absl::Milliseconds(50));
      FiguredStep(policy, 1);  // rank 5's step after the phase: it waits
      const absl::Time ahead = clock.Now();
      policy.OnProcessState(0, Running(cpu_ms));
      if (first) {
        for (int look = 0; look < 200; ++look) {  // 20 s on one core
          clock.Advance(absl::Milliseconds(100));
          policy.OnProcessState(0, Running(cpu_ms += 100));
          ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
        }
        continue;
      }
      EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(2))
          << "2 s of CPU from this look on, at one core";
      for (int look = 1; look < 20; ++look) {
        clock.Advance(absl::Milliseconds(100));
        policy.OnProcessState(0, Running(cpu_ms += 100));
        ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
      }
      clock.Advance(absl::Milliseconds(100));
      policy.OnProcessState(0, Running(cpu_ms += 100));
      ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
      ASSERT_EQ(policy.failures().size(), 1u);
      const LocalFailure& f = policy.failures()[0];
      EXPECT_EQ(f.local_rank, 0);
      EXPECT_TRUE(f.spinning);
      EXPECT_EQ(f.phase, phase);
      EXPECT_EQ(f.waited_by, 1);
      EXPECT_EQ(f.cpu, absl::Seconds(2));
      EXPECT_THAT(DescribeHang(f),
                  ::testing::HasSubstr(
                      phase == Phase::kEval
                          ? "of CPU without finishing its evaluation while "
                            "local rank 1 waited"
                          : "of CPU without finishing its checkpoint write "
                            "while local rank 1 waited"));
      const RecoveryDecision decision = policy.DecideRecovery();
      EXPECT_TRUE(decision.in_place);
      EXPECT_EQ(decision.replace, std::vector<int>{0});
    }
  }
}

// A node's only rank, deadlocked or spinning: no local peer waits for it,
// but the server answers that a rank of the round completed the next step
// (OnRoundSteps), so a rank of another node does. It is hung as with a
// local peer, and it is the cause: no other node's report is awaited.
TEST_F(SupervisorPolicyTest, ANodesOnlyRankAnotherNodeWaitsForIsHung) {
  for (bool spin : {false, true}) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 1, .reports_between_steps = true},
                            Adaptive(), clock);
    policy.OnInPlaceDeclared(0);
    ThreeFiguredSteps(policy, clock, 1);
    policy.OnRoundSteps(3, clock.Now());  // level with the others
    int cpu_ms = 700;
    auto look = [&] {
      policy.OnProcessState(0, spin ? Running(cpu_ms) : Asleep(cpu_ms));
      if (spin) cpu_ms += 100;
    };
    for (int i = 0; i < 20; ++i) {
      look();
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << spin << " " << i;
      clock.Advance(absl::Milliseconds(100));
    }
    policy.OnRoundSteps(4, clock.Now());  // another node's rank, a step ahead
    const absl::Time ahead = clock.Now();
    look();
    EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1)) << spin;
    for (int i = 0; i < 9; ++i) {
      clock.Advance(absl::Milliseconds(100));
      look();
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << spin << " " << i;
    }
    clock.Advance(absl::Milliseconds(100));
    look();
    ASSERT_EQ(policy.Evaluate(), Verdict::kFailed) << spin;
    const LocalFailure& f = policy.failures()[0];
    EXPECT_EQ(f.blocked, !spin);
    EXPECT_EQ(f.spinning, spin);
    EXPECT_EQ(f.waited_by, -1);
    EXPECT_THAT(DescribeHang(f),
                ::testing::HasSubstr("while a rank of another node waited "
                                     "for it"));
    EXPECT_FALSE(policy.AwaitsRemoteCause(2)) << spin;
    const RecoveryDecision decision = policy.DecideRecovery();
    EXPECT_TRUE(decision.in_place);
    EXPECT_EQ(decision.replace, std::vector<int>{0});
  }
}

// The answer comes a heartbeat or two after the rank of another node got a
// step ahead; the server says how long ago (round_steps_age_ms), and the
// wait is timed from then: a node's only rank, deadlocked, is found 1 s
// after the peer began to wait, not 1 s after the answer.
TEST_F(SupervisorPolicyTest, ARemoteWaitIsTimedFromWhenThePeerGotAhead) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1}, Adaptive(), clock);
  policy.OnInPlaceDeclared(0);
  ThreeFiguredSteps(policy, clock, 1);
  policy.OnProcessState(0, Asleep(700));
  clock.Advance(absl::Milliseconds(100));
  policy.OnProcessState(0, Asleep(700));  // asleep from here
  clock.Advance(absl::Milliseconds(50));
  const absl::Time ahead = clock.Now();  // another node's rank records
  clock.Advance(absl::Milliseconds(450));
  policy.OnRoundSteps(4, ahead);  // the answer that says so
  policy.OnProcessState(0, Asleep(700));
  EXPECT_EQ(policy.NextHangDeadline(), ahead + absl::Seconds(1));
  // A date in the future (clocks are not compared, but an answer is not
  // trusted to be earlier than now) counts from now.
  SupervisorPolicy later({.num_workers = 1}, Adaptive(), clock);
  ThreeFiguredSteps(later, clock, 1);
  for (int i = 0; i < 2; ++i) {
    later.OnProcessState(0, Asleep(700));
    clock.Advance(absl::Milliseconds(100));
  }
  later.OnRoundSteps(4, clock.Now() + absl::Hours(1));
  later.OnProcessState(0, Asleep(700));
  EXPECT_EQ(later.NextHangDeadline(), clock.Now() + absl::Seconds(1));
}

// The same for a spin: learned from an answer 0.55 s after the rank of
// another node got ahead, its CPU counts from the first look since then,
// not from the look after the answer. Found after 1 s of CPU from there.
TEST_F(SupervisorPolicyTest, ASpinLearnedLateCountsItsCpuFromTheWaitsStart) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 1, .reports_between_steps = true},
                          Adaptive(), clock);
  policy.OnInPlaceDeclared(0);
  ThreeFiguredSteps(policy, clock, 1);
  int cpu_ms = 700;
  auto look = [&] {
    policy.OnProcessState(0, Running(cpu_ms));
    cpu_ms += 100;  // a full core
  };
  look();
  clock.Advance(absl::Milliseconds(50));
  const absl::Time ahead = clock.Now();
  for (int i = 0; i < 5; ++i) {  // the first at ahead + 50 ms, CPU 800 ms
    clock.Advance(absl::Milliseconds(i == 0 ? 50 : 100));
    look();
  }
  policy.OnRoundSteps(4, ahead);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(absl::Milliseconds(100));
    look();
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << i;
  }
  clock.Advance(absl::Milliseconds(100));
  look();  // CPU 1800 ms: 1 s since the first look after `ahead`
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  const LocalFailure& f = policy.failures()[0];
  EXPECT_TRUE(f.spinning);
  EXPECT_EQ(f.cpu, absl::Seconds(1));
  EXPECT_EQ(f.silent, absl::Milliseconds(1050));
  EXPECT_EQ(f.waited_by, -1);
}

// The round's most steps two ahead is no lockstep (a figure of another
// round's stepping, or a count this rank missed): nothing is inferred. Nor
// from a program whose records carry no compute figure.
TEST_F(SupervisorPolicyTest, TheRoundsStepsCountOnlyOneStepAhead) {
  for (int ahead : {2, 1}) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 1}, Adaptive(), clock);
    for (int step = 0; step < 3; ++step) {
      clock.Advance(absl::Milliseconds(50));
      ahead == 2 ? FiguredStep(policy, 0) : Step(policy, 0);
    }
    policy.OnRoundSteps(3 + ahead, clock.Now());
    for (int i = 0; i < 50; ++i) {
      policy.OnProcessState(0, Asleep(700));
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << ahead << " " << i;
      clock.Advance(absl::Milliseconds(100));
    }
  }
}

// A node's only rank, a survivor, blocked or spinning when its round
// changed: no local peer waits in the join, but the round has ranks on
// other nodes (multi_node), which wait there for it. It is hung from when
// the round was sent to it, as with a local peer; in a round of this node
// alone, nobody waits for it.
TEST_F(SupervisorPolicyTest, ANodesOnlySurvivorThatDoesNotTakeTheRoundIsHung) {
  for (bool spin : {false, true}) {
    for (bool multi_node : {true, false}) {
      common::FakeClock clock;
      SupervisorPolicy policy({.num_workers = 1,
                               .in_place = {true},
                               .survivors = {true},
                               .figured_steps = true,
                               .reports_between_steps = true,
                               .multi_node = multi_node},
                              Adaptive(), clock);
      const absl::Time told = clock.Now();
      int cpu_ms = 900;
      auto look = [&] {
        policy.OnProcessState(0, spin ? Running(cpu_ms) : Asleep(cpu_ms));
        if (spin) cpu_ms += 100;
      };
      // A spin counts from the first look; being asleep without using CPU,
      // from the second (the first has no CPU time to compare with).
      const absl::Time hung_at =
          told + (spin ? absl::Seconds(1) : absl::Milliseconds(1100));
      look();
      while (clock.Now() + absl::Milliseconds(100) < hung_at) {
        clock.Advance(absl::Milliseconds(100));
        look();
        ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << spin;
      }
      clock.Advance(absl::Milliseconds(100));
      look();
      if (!multi_node) {
        EXPECT_EQ(policy.Evaluate(), Verdict::kRunning) << spin;
        continue;
      }
      ASSERT_EQ(policy.Evaluate(), Verdict::kFailed) << spin;
      const LocalFailure& f = policy.failures()[0];
      EXPECT_EQ(f.blocked, !spin);
      EXPECT_EQ(f.spinning, spin);
      EXPECT_EQ(f.phase, Phase::kJoin);
      EXPECT_EQ(f.waited_by, -1);
      EXPECT_EQ(f.time, hung_at) << spin;
      EXPECT_FALSE(policy.AwaitsRemoteCause(2));
      EXPECT_EQ(policy.DecideRecovery().replace, std::vector<int>{0});
    }
  }
}

// A worker whose round could not form (a peer it could not reach while a
// network cut lasted) waits for the next round, and nobody else ends this
// one: its peers wait in the join. A next round that comes ends the wait
// (a new policy); when none came within the bound (3 s), it is hung and
// replaced, which ends the round at once. Before, the job waited the
// join's bound twice over (60 s in CI's fault_harness_partition_test).
TEST_F(SupervisorPolicyTest, AWorkerWhoseRoundCouldNotFormIsReplacedInTime) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 2,
                           .in_place = {true, true},
                           .survivors = {true, true},
                           .figured_steps = true,
                           .multi_node = true},
                          Adaptive(), clock);
  for (int i = 0; i < 2; ++i) policy.OnRecord(i, PhaseRecord(Phase::kJoin));
  clock.Advance(absl::Milliseconds(300));
  policy.OnRecord(1, {.kind = ProgressRecord::Kind::kRoundFailed});
  const absl::Time gave_up = clock.Now();
  EXPECT_EQ(policy.NextHangDeadline(), gave_up + absl::Seconds(3));
  clock.Advance(absl::Milliseconds(2900));
  for (int i = 0; i < 2; ++i) policy.OnProcessState(i, Asleep(500));
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
  clock.Advance(absl::Milliseconds(100));
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  const LocalFailure& f = policy.failures()[0];
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_TRUE(f.gave_up_round);
  EXPECT_EQ(f.phase, Phase::kJoin);
  EXPECT_EQ(f.silent, absl::Seconds(3));
  EXPECT_EQ(DescribeHang(f),
            "waiting for 3s in phase join for a next round that did not come: "
            "its round could not form (a peer it could not reach) and nobody "
            "else ended it");
  EXPECT_FALSE(policy.AwaitsRemoteCause(2));
  const RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{1});
  EXPECT_EQ(decision.kill, std::vector<int>{1});
}

// What a step costs in CPU is learned from the looks at which a rank's
// step count moved: steps of 400 ms of CPU make the spin bound 2 s. A
// straggler whose step takes long in wall time (a CPU quota, a busy
// machine) but no more CPU than before is not a spin.
TEST_F(SupervisorPolicyTest, TheSpinBoundIsLearnedInCpuTimeSoAStragglerIsNone) {
  common::FakeClock clock;
  PhaseBounds& bounds = Adaptive();
  SupervisorPolicy policy(
      {.num_workers = 2, .figured_steps = true, .reports_between_steps = true},
      bounds, clock);
  int cpu_ms = 0;
  for (int step = 0; step < 4; ++step) {
    policy.OnProcessState(1, Running(cpu_ms));
    clock.Advance(absl::Milliseconds(400));
    cpu_ms += 400;
    for (int i = 0; i < 2; ++i) FiguredStep(policy, i);
  }
  policy.OnProcessState(1, Running(cpu_ms));
  EXPECT_EQ(bounds.SpinBound(), absl::Seconds(2)) << "5 x 400 ms";
  FiguredStep(policy, 0);  // a step ahead
  // Rank 1, throttled to 20 % of a core, takes 4 s for a step of 400 ms
  // of CPU; the step's own bound (10 s) is not reached either.
  for (int look = 0; look < 40; ++look) {
    clock.Advance(absl::Milliseconds(100));
    cpu_ms += 20;
    policy.OnProcessState(1, Running(cpu_ms));
    ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << look;
  }
  FiguredStep(policy, 1);
  EXPECT_EQ(policy.Evaluate(), Verdict::kRunning);
}

// What is not a spin: a rank nobody waits for, one whose program never
// reported an evaluation or a checkpoint (its rank 0 may evaluate without
// saying so), and any with --hang-bound spin=0. Each is bounded as a silent
// step instead (10 s).
TEST_F(SupervisorPolicyTest, OnlyARankAPeerWaitsForInAReportingProgramSpins) {
  struct Case {
    const char* what;
    bool peer_ahead = true;
    bool reports = true;
    PhaseBoundsOptions options;
  };
  PhaseBoundsOptions never;
  never.spin_fixed = absl::InfiniteDuration();
  const std::vector<Case> cases = {
      {"nobody waits", /*peer_ahead=*/false},
      {"work between steps unreported", true, /*reports=*/false},
      {"--hang-bound spin=0", true, true, never},
  };
  for (const Case& c : cases) {
    common::FakeClock clock;
    SupervisorPolicy policy(
        {.num_workers = 2, .reports_between_steps = c.reports},
        Adaptive(c.options), clock);
    ThreeFiguredSteps(policy, clock, 2);
    if (c.peer_ahead) FiguredStep(policy, 0);
    int cpu_ms = 700;
    for (int look = 0; look < 50; ++look) {  // 5 s on one core
      policy.OnProcessState(1, Running(cpu_ms));
      cpu_ms += 100;
      ASSERT_EQ(policy.Evaluate(), Verdict::kRunning) << c.what;
      clock.Advance(absl::Milliseconds(100));
    }
  }
}

// A program says it reports its work between steps by declaring it
// (worker::DeclareReportsBetweenSteps), or with its first evaluation or
// checkpoint record; the agent carries that to the next rounds
// (reports_between_steps).
TEST_F(SupervisorPolicyTest, AProgramSaysItReportsItsWorkBetweenSteps) {
  const std::vector<ProgressRecord> records = {
      {.kind = ProgressRecord::Kind::kReportsBetweenSteps},
      PhaseRecord(Phase::kEval),
      PhaseRecord(Phase::kCheckpoint)};
  for (const ProgressRecord& record : records) {
    common::FakeClock clock;
    SupervisorPolicy policy({.num_workers = 2}, Adaptive(), clock);
    ThreeFiguredSteps(policy, clock, 2);
    policy.OnRecord(0, PhaseRecord(Phase::kSync));
    EXPECT_FALSE(policy.reports_between_steps());
    policy.OnRecord(0, record);
    EXPECT_TRUE(policy.reports_between_steps())
        << static_cast<int>(record.kind) << " "
        << common::PhaseName(record.phase);
  }
}

TEST(PhaseBoundsTest, TheSpinBoundIsASecondOrFiveCostliestSteps) {
  PhaseBounds bounds;
  EXPECT_EQ(bounds.SpinBound(), absl::Seconds(1));
  bounds.ObserveStepCpu(absl::Milliseconds(100));
  EXPECT_EQ(bounds.SpinBound(), absl::Seconds(1));
  bounds.ObserveStepCpu(absl::Milliseconds(800));
  bounds.ObserveStepCpu(absl::Milliseconds(300));
  EXPECT_EQ(bounds.SpinBound(), absl::Seconds(4)) << "5 x 0.8 s";
  PhaseBoundsOptions options;
  options.spin_fixed = absl::Seconds(3);
  EXPECT_EQ(PhaseBounds(options).SpinBound(), absl::Seconds(3));
}

TEST(PhaseBoundsTest, TheBlockedBoundIsASecondOrFiveCostliestComputes) {
  PhaseBounds bounds;
  EXPECT_EQ(bounds.BlockedBound(Phase::kStep), absl::Seconds(1));
  bounds.ObserveStepCompute(absl::Milliseconds(100));
  EXPECT_EQ(bounds.BlockedBound(Phase::kStep), absl::Seconds(1));
  bounds.Observe(Phase::kStep, absl::Seconds(4));  // a step that waited
  EXPECT_EQ(bounds.BlockedBound(Phase::kStep), absl::Seconds(1))
      << "the time between records is not the rank's own";
  bounds.ObserveStepCompute(absl::Milliseconds(800));
  EXPECT_EQ(bounds.BlockedBound(Phase::kStep), absl::Seconds(4)) << "5 x 0.8 s";
  EXPECT_EQ(bounds.BlockedBound(Phase::kJoin), absl::Seconds(4));
  PhaseBoundsOptions options;
  options.blocked_fixed = absl::Seconds(3);
  EXPECT_EQ(PhaseBounds(options).BlockedBound(Phase::kStep), absl::Seconds(3));
  EXPECT_EQ(PhaseBounds(options).BlockedBound(Phase::kCheckpoint, 0),
            absl::Seconds(3));
}

// In a checkpoint write or an evaluation, the rank's own longest there
// counts: the writer's, not its peers' that only passed through the phase.
TEST(PhaseBoundsTest, ACheckpointsBlockedBoundIsLearnedByRank) {
  PhaseBounds bounds;
  EXPECT_EQ(bounds.BlockedBound(Phase::kCheckpoint, 0), absl::Seconds(10));
  bounds.Observe(Phase::kCheckpoint, absl::Milliseconds(50), /*rank=*/1);
  EXPECT_EQ(bounds.BlockedBound(Phase::kCheckpoint, 1), absl::Seconds(1));
  EXPECT_EQ(bounds.BlockedBound(Phase::kCheckpoint, 0), absl::Seconds(10))
      << "rank 1's checkpoints say nothing of rank 0's writes";
  bounds.Observe(Phase::kCheckpoint, absl::Milliseconds(600), /*rank=*/0);
  EXPECT_EQ(bounds.BlockedBound(Phase::kCheckpoint, 0), absl::Seconds(3))
      << "5 x 0.6 s";
  EXPECT_EQ(bounds.BlockedBound(Phase::kEval, 0), absl::Seconds(10));
  bounds.Observe(Phase::kCheckpoint, absl::Seconds(3), /*rank=*/2);
  EXPECT_EQ(bounds.BlockedBound(Phase::kCheckpoint, 3), absl::Seconds(15))
      << "unseen: 5 x the longest of any rank, when above 10 s";
}

// In a checkpoint write or an evaluation, the rank's own CPU there counts,
// as its time there does for a deadlock; before it was seen there, only a
// fixed bound applies.
TEST(PhaseBoundsTest, ACheckpointsSpinBoundIsLearnedByRankInCpuTime) {
  PhaseBounds bounds;
  EXPECT_EQ(bounds.SpinBound(Phase::kCheckpoint, 0), absl::InfiniteDuration());
  bounds.ObservePhaseCpu(Phase::kCheckpoint, absl::Milliseconds(50), 1);
  EXPECT_EQ(bounds.SpinBound(Phase::kCheckpoint, 1), absl::Seconds(1));
  EXPECT_EQ(bounds.SpinBound(Phase::kCheckpoint, 0), absl::InfiniteDuration())
      << "rank 1's checkpoints say nothing of rank 0's writes";
  bounds.ObservePhaseCpu(Phase::kEval, absl::Milliseconds(600), 0);
  bounds.ObservePhaseCpu(Phase::kEval, absl::Milliseconds(200), 0);
  EXPECT_EQ(bounds.SpinBound(Phase::kEval, 0), absl::Seconds(3)) << "5 x 0.6 s";
  bounds.ObserveStepCpu(absl::Milliseconds(400));
  EXPECT_EQ(bounds.SpinBound(Phase::kStep, 0), absl::Seconds(2))
      << "a step's is the costliest step's";
  PhaseBoundsOptions options;
  options.spin_fixed = absl::Seconds(3);
  EXPECT_EQ(PhaseBounds(options).SpinBound(Phase::kCheckpoint, 0),
            absl::Seconds(3));
}

// --straggler-policy replace: a named straggler is killed and replaced.
TEST_F(SupervisorPolicyTest, ANamedStragglerIsKilledAndReplacedInPlace) {
  common::FakeClock clock;
  SupervisorPolicy policy({.num_workers = 3}, Adaptive(), clock);
  for (int i = 0; i < 3; ++i) policy.OnInPlaceDeclared(i);
  ASSERT_EQ(policy.Evaluate(), Verdict::kRunning);
  policy.OnStraggler(2);
  ASSERT_EQ(policy.Evaluate(), Verdict::kFailed);
  ASSERT_EQ(policy.failures().size(), 1u);
  EXPECT_EQ(policy.failures()[0].cause, v1::FAILURE_CAUSE_STRAGGLER);
  EXPECT_FALSE(policy.AwaitsRemoteCause(2));
  RecoveryDecision decision = policy.DecideRecovery();
  EXPECT_TRUE(decision.in_place);
  EXPECT_EQ(decision.replace, std::vector<int>{2});
  EXPECT_EQ(decision.kill, std::vector<int>{2});
  // Its exit after the kill is not a second failure.
  policy.OnExit(2, ExitStatus::Signaled(9));
  policy.OnStraggler(2);
  EXPECT_EQ(policy.failures().size(), 1u);
}

}  // namespace
}  // namespace ddprun::launcher
