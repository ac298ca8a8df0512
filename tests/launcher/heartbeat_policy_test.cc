// HeartbeatPolicy on a fake clock: when a node's round is over, when it
// resumes a restarted server, when an outage starts and ends, how its
// heartbeat stream is reopened, and which heartbeats carry the ranks'
// figures. No server, no thread, no real time.
#include "launcher/agent/heartbeat_policy.h"

#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

using Next = HeartbeatPolicy::Next;
using StreamNext = HeartbeatPolicy::StreamNext;
using ::testing::ElementsAre;

constexpr absl::Duration kInterval = absl::Milliseconds(250);

v1::HeartbeatResponse Running() {
  v1::HeartbeatResponse r;
  r.set_state(v1::JOB_STATE_RUNNING);
  return r;
}

absl::Status Unavailable() { return absl::UnavailableError("down"); }
absl::Status NotFound() { return absl::NotFoundError("no job 'j'"); }

// Reopen backoff without jitter: 100 ms doubling up to 400 ms.
HeartbeatPolicyOptions Options(absl::Duration timeout) {
  HeartbeatPolicyOptions options;
  options.timeout = timeout;
  options.reopen_backoff = {.initial = absl::Milliseconds(100),
                            .max = absl::Milliseconds(400),
                            .multiplier = 2.0,
                            .jitter = 0};
  return options;
}

// One interval passes, then a heartbeat is sent and answered at once.
HeartbeatPolicy::Step Beat(
    HeartbeatPolicy& policy, common::FakeClock& clock,
    const absl::StatusOr<v1::HeartbeatResponse>& answer) {
  clock.Advance(kInterval);
  return policy.OnAnswer(answer, clock.Now(), clock.Now());
}

v1::ResumeResponse TakenBack(int64_t round) {
  v1::ResumeResponse r;
  r.mutable_assignment()->set_round(round);
  return r;
}

TEST(HeartbeatPolicyTest, FailedHeartbeatsEndTheRoundAtTheTimeoutExactly) {
  common::FakeClock clock;
  const absl::Time joined = clock.Now();
  HeartbeatPolicy policy(Options(absl::Seconds(1)), joined);

  std::vector<absl::Duration> failed_at;
  HeartbeatPolicy::Step step;
  while ((step = Beat(policy, clock, Unavailable())).next == Next::kBeatAgain) {
    failed_at.push_back(clock.Now() - joined);
  }

  EXPECT_THAT(failed_at,
              ElementsAre(absl::Milliseconds(250), absl::Milliseconds(500),
                          absl::Milliseconds(750)));
  EXPECT_EQ(step.next, Next::kTimedOut);
  EXPECT_EQ(step.unheard_for, absl::Seconds(1));
  EXPECT_EQ(clock.Now() - joined, absl::Seconds(1));
}

TEST(HeartbeatPolicyTest, AnOutageIsNamedOnceAndItsEndOnce) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(60)), clock.Now());
  EXPECT_FALSE(Beat(policy, clock, Running()).outage_ended);
  EXPECT_TRUE(Beat(policy, clock, Unavailable()).outage_started);
  EXPECT_FALSE(Beat(policy, clock, Unavailable()).outage_started);
  EXPECT_FALSE(Beat(policy, clock, Unavailable()).outage_started);
  HeartbeatPolicy::Step back = Beat(policy, clock, Running());
  EXPECT_EQ(back.next, Next::kBeatAgain);
  EXPECT_TRUE(back.outage_ended);
  EXPECT_FALSE(Beat(policy, clock, Running()).outage_ended);
  EXPECT_TRUE(Beat(policy, clock, Unavailable()).outage_started);
}

// The bound counts from the sending of the last answered heartbeat, not
// from its answer: the server heard the node no later than that.
TEST(HeartbeatPolicyTest, AnAnsweredHeartbeatStartsTheBoundAtItsSending) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(1)), clock.Now());
  const absl::Time sent = clock.Now() + absl::Seconds(5);
  clock.Advance(absl::Seconds(5) + absl::Milliseconds(300));  // a slow answer
  ASSERT_EQ(policy.OnAnswer(Running(), sent, clock.Now()).next,
            Next::kBeatAgain);
  clock.Advance(absl::Milliseconds(600));  // 900 ms after the sending
  EXPECT_EQ(policy.OnAnswer(Unavailable(), clock.Now(), clock.Now()).next,
            Next::kBeatAgain);
  clock.Advance(absl::Milliseconds(100));
  HeartbeatPolicy::Step step =
      policy.OnAnswer(Unavailable(), clock.Now(), clock.Now());
  EXPECT_EQ(step.next, Next::kTimedOut);
  EXPECT_EQ(step.unheard_for, absl::Seconds(1));
}

TEST(HeartbeatPolicyTest, WithoutATimeoutFailuresNeverEndTheRound) {
  common::FakeClock clock;
  HeartbeatPolicy policy(HeartbeatPolicyOptions{}, clock.Now());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(Beat(policy, clock, Unavailable()).next, Next::kBeatAgain);
  }
}

TEST(HeartbeatPolicyTest, TheServersWordEndsTheRound) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  v1::HeartbeatResponse rejoin = Running();
  rejoin.set_rejoin(true);
  EXPECT_EQ(Beat(policy, clock, rejoin).next, Next::kRoundOver);
  v1::HeartbeatResponse failed;
  failed.set_state(v1::JOB_STATE_FAILED);
  EXPECT_EQ(Beat(policy, clock, failed).next, Next::kRoundOver);
  // Workers still running here finish and Leave.
  v1::HeartbeatResponse succeeded;
  succeeded.set_state(v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Beat(policy, clock, succeeded).next, Next::kBeatAgain);
}

// The server restarted and lost the job (NOT_FOUND): the node resumes its
// round there, and the server has heard it as of that heartbeat.
TEST(HeartbeatPolicyTest, ARestartedServerThatTakesTheRoundBackKeepsIt) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(1)), clock.Now());
  ASSERT_EQ(Beat(policy, clock, Unavailable()).next, Next::kBeatAgain);
  ASSERT_EQ(Beat(policy, clock, Unavailable()).next, Next::kBeatAgain);
  ASSERT_EQ(Beat(policy, clock, Unavailable()).next, Next::kBeatAgain);
  // 750 ms without an answer; the new server answers NOT_FOUND.
  HeartbeatPolicy::Step step = Beat(policy, clock, NotFound());
  ASSERT_EQ(step.next, Next::kResume);
  const absl::Time resumed_at = clock.Now();
  step = policy.OnResumed(ResumeAnswer::kTookBack, clock.Now());
  EXPECT_EQ(step.next, Next::kBeatAgain);
  EXPECT_FALSE(step.outage_ended) << "Resume logs the round's return";
  // The bound counts from the heartbeat that found the new server.
  clock.Advance(absl::Milliseconds(999));
  EXPECT_EQ(policy.OnAnswer(Unavailable(), clock.Now(), clock.Now()).next,
            Next::kBeatAgain);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(policy.OnAnswer(Unavailable(), clock.Now(), clock.Now()).next,
            Next::kTimedOut);
  EXPECT_EQ(clock.Now() - resumed_at, absl::Seconds(1));
}

// A server that restarts and is not up yet for Resume: the NOT_FOUND
// heartbeat counts as a failed one, and the round ends at the bound.
TEST(HeartbeatPolicyTest, AResumeThatFailsCountsAsAFailedHeartbeat) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(1)), clock.Now());
  std::vector<bool> started;
  HeartbeatPolicy::Step step;
  do {
    ASSERT_EQ(Beat(policy, clock, NotFound()).next, Next::kResume);
    step = policy.OnResumed(ResumeAnswer::kFailed, clock.Now());
    started.push_back(step.outage_started);
  } while (step.next == Next::kBeatAgain);
  EXPECT_EQ(step.next, Next::kTimedOut);
  EXPECT_THAT(started, ElementsAre(true, false, false, false));
}

TEST(HeartbeatPolicyTest, ARestartedServerThatCannotTakeTheRoundEndsIt) {
  for (ResumeAnswer answer :
       {ResumeAnswer::kFormingLost, ResumeAnswer::kCannotGoOn,
        ResumeAnswer::kNoResume}) {
    common::FakeClock clock;
    HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
    ASSERT_EQ(Beat(policy, clock, NotFound()).next, Next::kResume);
    EXPECT_EQ(policy.OnResumed(answer, clock.Now()).next, Next::kNotResumed)
        << static_cast<int>(answer);
  }
}

// A server that rebuilt the job from other nodes' records asks this node
// for its record (HeartbeatResponse.resume): the heartbeat was answered, so
// a Resume that fails is retried at the next beat, not counted.
TEST(HeartbeatPolicyTest, AServerThatAsksForTheRecordGetsAResume) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Milliseconds(100)), clock.Now());
  v1::HeartbeatResponse asks = Running();
  asks.set_resume(true);
  HeartbeatPolicy::Step step = Beat(policy, clock, asks);
  ASSERT_EQ(step.next, Next::kResume);
  step = policy.OnResumed(ResumeAnswer::kFailed, clock.Now());
  EXPECT_EQ(step.next, Next::kBeatAgain);
  EXPECT_FALSE(step.outage_started);
  ASSERT_EQ(Beat(policy, clock, asks).next, Next::kResume);
  EXPECT_EQ(policy.OnResumed(ResumeAnswer::kNotSent, clock.Now()).next,
            Next::kBeatAgain);
  ASSERT_EQ(Beat(policy, clock, asks).next, Next::kResume);
  EXPECT_EQ(policy.OnResumed(ResumeAnswer::kCannotGoOn, clock.Now()).next,
            Next::kNotResumed);
}

TEST(HeartbeatPolicyTest, ResumeAnswersAreReadAsTheRoundsFate) {
  auto never = [] {
    ADD_FAILURE() << "forming asked though the round was not taken back";
    return true;
  };
  EXPECT_EQ(ReadResumeAnswer(TakenBack(4), 4, [] { return false; }),
            ResumeAnswer::kTookBack);
  EXPECT_EQ(ReadResumeAnswer(TakenBack(5), 4, never),
            ResumeAnswer::kCannotGoOn);
  v1::ResumeResponse succeeded;
  succeeded.mutable_ended()->set_state(v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ReadResumeAnswer(succeeded, 4, never), ResumeAnswer::kJobSucceeded);
  v1::ResumeResponse failed;
  failed.mutable_ended()->set_state(v1::JOB_STATE_FAILED);
  EXPECT_EQ(ReadResumeAnswer(failed, 4, never), ResumeAnswer::kCannotGoOn);
  EXPECT_EQ(ReadResumeAnswer(absl::UnimplementedError("old"), 4, never),
            ResumeAnswer::kNoResume);
  EXPECT_EQ(ReadResumeAnswer(Unavailable(), 4, never), ResumeAnswer::kFailed);
  EXPECT_TRUE(EndsRound(ResumeAnswer::kNoResume));
  EXPECT_TRUE(EndsRound(ResumeAnswer::kCannotGoOn));
  EXPECT_FALSE(EndsRound(ResumeAnswer::kJobSucceeded));
  EXPECT_FALSE(EndsRound(ResumeAnswer::kFailed));
}

// HeartbeatLoopOptions::forming: a server that restarted while the node's
// workers exchanged keys through the round's store lost those keys, so the
// round it takes back cannot complete: it is over, and forms again.
TEST(HeartbeatPolicyTest, ARestartWhileTheRoundFormsEndsTheRound) {
  int asked = 0;
  auto forming = [&asked] {
    ++asked;
    return true;
  };
  const ResumeAnswer answer = ReadResumeAnswer(TakenBack(4), 4, forming);
  EXPECT_EQ(answer, ResumeAnswer::kFormingLost);
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(EndsRound(answer));

  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  ASSERT_EQ(Beat(policy, clock, NotFound()).next, Next::kResume);
  EXPECT_EQ(policy.OnResumed(answer, clock.Now()).next, Next::kNotResumed);
}

TEST(HeartbeatPolicyTest, ABrokenStreamIsReopenedWithGrowingCappedBackoff) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  ASSERT_TRUE(policy.ShouldOpenStream(clock.Now()));
  std::vector<absl::Duration> reopened_after;
  for (int i = 0; i < 5; ++i) {
    const absl::Time broke = clock.Now();
    ASSERT_EQ(policy.OnStreamBeat(absl::StatusCode::kUnavailable, broke),
              StreamNext::kUnaryNow);
    while (!policy.ShouldOpenStream(clock.Now())) {
      clock.Advance(absl::Milliseconds(1));
    }
    reopened_after.push_back(clock.Now() - broke);
  }
  EXPECT_THAT(reopened_after,
              ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(400), absl::Milliseconds(400),
                          absl::Milliseconds(400)));
  // An answered beat starts the backoff over.
  EXPECT_EQ(policy.OnStreamBeat(absl::StatusCode::kOk, clock.Now()),
            StreamNext::kKeep);
  policy.OnStreamOpenFailed(absl::StatusCode::kUnavailable, clock.Now());
  EXPECT_FALSE(policy.ShouldOpenStream(clock.Now() + absl::Milliseconds(99)));
  EXPECT_TRUE(policy.ShouldOpenStream(clock.Now() + absl::Milliseconds(100)));
}

// After a server restart the stream answers NOT_FOUND (the server's own
// answer): the heartbeat resumes, and the next one opens a new stream.
TEST(HeartbeatPolicyTest, TheServersAnswerOnTheStreamReopensItAtOnce) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  EXPECT_EQ(policy.OnStreamBeat(absl::StatusCode::kNotFound, clock.Now()),
            StreamNext::kAnswer);
  EXPECT_TRUE(policy.ShouldOpenStream(clock.Now()));
  EXPECT_EQ(
      policy.OnStreamBeat(absl::StatusCode::kPermissionDenied, clock.Now()),
      StreamNext::kAnswer);
  EXPECT_TRUE(policy.uses_stream());
}

// A stalled stream (no answer within rpc_timeout): the heartbeat counts as
// failed without a unary call that would wait as long again.
TEST(HeartbeatPolicyTest, AStalledStreamFailsTheBeatAndReopensLater) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  EXPECT_EQ(
      policy.OnStreamBeat(absl::StatusCode::kDeadlineExceeded, clock.Now()),
      StreamNext::kAnswerLater);
  EXPECT_FALSE(policy.ShouldOpenStream(clock.Now()));
  EXPECT_TRUE(policy.ShouldOpenStream(clock.Now() + absl::Milliseconds(100)));
}

TEST(HeartbeatPolicyTest, AServerWithoutStreamsGetsUnaryBeatsForTheRound) {
  for (absl::StatusCode code : {absl::StatusCode::kUnimplemented,
                                absl::StatusCode::kResourceExhausted}) {
    common::FakeClock clock;
    HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
    EXPECT_EQ(policy.OnStreamBeat(code, clock.Now()),
              StreamNext::kUnaryForRound);
    EXPECT_FALSE(policy.uses_stream());
    EXPECT_FALSE(policy.ShouldOpenStream(clock.Now() + absl::Hours(1)));
  }
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  policy.OnStreamOpenFailed(absl::StatusCode::kUnimplemented, clock.Now());
  EXPECT_FALSE(policy.ShouldOpenStream(clock.Now() + absl::Hours(1)));
}

TEST(HeartbeatPolicyTest, UnaryOnlyNeverOpensAStream) {
  common::FakeClock clock;
  HeartbeatPolicyOptions options = Options(absl::Seconds(10));
  options.stream = false;
  HeartbeatPolicy policy(options, clock.Now());
  EXPECT_FALSE(policy.ShouldOpenStream(clock.Now()));
}

std::vector<v1::RankFigures> Figures(std::vector<std::string> phases) {
  std::vector<v1::RankFigures> figures;
  for (size_t i = 0; i < phases.size(); ++i) {
    v1::RankFigures& f = figures.emplace_back();
    f.set_local_rank(static_cast<int>(i));
    f.set_phase(phases[i]);
  }
  return figures;
}

TEST(HeartbeatPolicyTest, FiguresGoOnceASecondNotAtEveryHeartbeat) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  const std::vector<v1::RankFigures> figures = Figures({"step", "step"});
  // The first heartbeat with figures carries them, then one in four
  // (1 s at 250 ms).
  std::vector<bool> carried;
  for (int beat = 0; beat < 17; ++beat) {
    bool due = policy.FiguresDue(figures, clock.Now());
    carried.push_back(due);
    if (due) policy.FiguresDelivered(figures, clock.Now());
    clock.Advance(kInterval);
  }
  EXPECT_THAT(carried, ElementsAre(true, false, false, false, true, false,
                                   false, false, true, false, false, false,
                                   true, false, false, false, true));
}

TEST(HeartbeatPolicyTest, APhaseChangeSendsTheFiguresAtOnce) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  policy.FiguresDelivered(Figures({"step", "step"}), clock.Now());
  clock.Advance(kInterval);
  EXPECT_FALSE(policy.FiguresDue(Figures({"step", "step"}), clock.Now()));
  EXPECT_TRUE(policy.FiguresDue(Figures({"step", "exited"}), clock.Now()));
  EXPECT_TRUE(policy.FiguresDue(Figures({"step"}), clock.Now()));
}

TEST(HeartbeatPolicyTest, AComputeTimeThatMovesByAQuarterGoesAtOnce) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  auto with_mean = [](double mean_s) {
    std::vector<v1::RankFigures> figures = Figures({"step", "step"});
    figures[1].set_compute_mean_s(mean_s);
    figures[0].set_compute_mean_s(0.010);
    return figures;
  };
  policy.FiguresDelivered(with_mean(0.010), clock.Now());
  clock.Advance(kInterval);
  // Noise within a quarter waits for the interval.
  EXPECT_FALSE(policy.FiguresDue(with_mean(0.012), clock.Now()));
  EXPECT_FALSE(policy.FiguresDue(with_mean(0.008), clock.Now()));
  // A rank slowing down (a straggler in the making) or speeding up goes.
  EXPECT_TRUE(policy.FiguresDue(with_mean(0.013), clock.Now()));
  EXPECT_TRUE(policy.FiguresDue(with_mean(0.007), clock.Now()));
  // A rank's first compute figure goes, and so does its losing it.
  policy.FiguresDelivered(with_mean(0), clock.Now());
  EXPECT_TRUE(policy.FiguresDue(with_mean(0.010), clock.Now()));
  policy.FiguresDelivered(with_mean(0.010), clock.Now());
  EXPECT_TRUE(policy.FiguresDue(with_mean(0), clock.Now()));
}

TEST(HeartbeatPolicyTest, FiguresNotDeliveredGoAgainAtTheNextHeartbeat) {
  common::FakeClock clock;
  HeartbeatPolicy policy(Options(absl::Seconds(10)), clock.Now());
  // The first figures' heartbeat failed: FiguresDelivered was not called.
  EXPECT_TRUE(policy.FiguresDue(Figures({"step"}), clock.Now()));
  clock.Advance(kInterval);
  EXPECT_TRUE(policy.FiguresDue(Figures({"step"}), clock.Now()));
  // No figures (no ranks reported yet): nothing to carry.
  EXPECT_FALSE(policy.FiguresDue({}, clock.Now()));
}

}  // namespace
}  // namespace ddprun::launcher
