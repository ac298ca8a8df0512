// JoinRetryPolicy on a fake clock: what a Join does after each answer, with
// time stepped by the waits the policy asks for. No server, no real time.
#include "launcher/agent/join_retry_policy.h"

#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

using Action = JoinRetryPolicy::Action;
using ::testing::ElementsAre;

constexpr absl::StatusCode kUnavailable = absl::StatusCode::kUnavailable;

// Backoff without jitter: 100 ms doubling up to 400 ms.
JoinRetryPolicyOptions Options(absl::Duration unreachable_timeout) {
  JoinRetryPolicyOptions options;
  options.unreachable_timeout = unreachable_timeout;
  options.backoff.initial = absl::Milliseconds(100);
  options.backoff.max = absl::Milliseconds(400);
  options.backoff.multiplier = 2.0;
  options.backoff.jitter = 0;
  return options;
}

// Fails every attempt UNAVAILABLE, stepping the clock by each wait, until
// the policy says to return; the waits it asked for, in order.
std::vector<absl::Duration> RetryUntilGivenUp(JoinRetryPolicy& policy,
                                              common::FakeClock& clock) {
  std::vector<absl::Duration> waits;
  while (true) {
    JoinRetryPolicy::Step step = policy.OnFailed(kUnavailable, clock.Now());
    if (step.action == Action::kReturn) return waits;
    EXPECT_EQ(step.action, Action::kRetry);
    waits.push_back(step.wait);
    clock.Advance(step.wait);
    if (waits.size() > 100) {
      ADD_FAILURE() << "never gave up";
      return waits;
    }
  }
}

TEST(JoinRetryPolicyTest, AnUnreachableServerIsRetriedUntilTheBoundExactly) {
  common::FakeClock clock;
  const absl::Time start = clock.Now();
  JoinRetryPolicy policy(Options(absl::Seconds(1)), start);

  std::vector<absl::Duration> waits = RetryUntilGivenUp(policy, clock);

  // 100, 200, 400, 400 ms would pass the bound: the last wait ends on it.
  EXPECT_THAT(waits,
              ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(400), absl::Milliseconds(300)));
  EXPECT_EQ(clock.Now() - start, absl::Seconds(1));
  EXPECT_EQ(policy.give_up(), start + absl::Seconds(1));
}

TEST(JoinRetryPolicyTest, TheBackoffGrowsAndStaysAtItsCap) {
  common::FakeClock clock;
  JoinRetryPolicy policy(Options(absl::Hours(1)), clock.Now());
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 6; ++i) {
    JoinRetryPolicy::Step step = policy.OnFailed(kUnavailable, clock.Now());
    ASSERT_EQ(step.action, Action::kRetry);
    waits.push_back(step.wait);
    clock.Advance(step.wait);
  }
  EXPECT_THAT(waits,
              ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(400), absl::Milliseconds(400),
                          absl::Milliseconds(400), absl::Milliseconds(400)));
}

TEST(JoinRetryPolicyTest, WithJitterEachWaitStaysWithinItsBand) {
  common::FakeClock clock;
  JoinRetryPolicyOptions options = Options(absl::Hours(1));
  options.backoff.jitter = 0.2;
  JoinRetryPolicy policy(options, clock.Now());
  absl::Duration nominal = absl::Milliseconds(100);
  for (int i = 0; i < 8; ++i) {
    JoinRetryPolicy::Step step = policy.OnFailed(kUnavailable, clock.Now());
    ASSERT_EQ(step.action, Action::kRetry);
    EXPECT_GE(step.wait, nominal * 0.8) << "attempt " << i;
    EXPECT_LE(step.wait, nominal * 1.2) << "attempt " << i;
    nominal = std::min(nominal * 2, absl::Milliseconds(400));
  }
}

TEST(JoinRetryPolicyTest, AnythingButUnavailableIsReturnedAtOnce) {
  common::FakeClock clock;
  JoinRetryPolicy policy(Options(absl::Seconds(60)), clock.Now());
  for (absl::StatusCode code :
       {absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kCancelled,
        absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kFailedPrecondition}) {
    EXPECT_EQ(policy.OnFailed(code, clock.Now()).action, Action::kReturn)
        << absl::StatusCodeToString(code);
  }
}

TEST(JoinRetryPolicyTest, WithNoTimeoutTheFirstFailureIsReturned) {
  common::FakeClock clock;
  JoinRetryPolicy policy(Options(absl::ZeroDuration()), clock.Now());
  EXPECT_EQ(policy.OnFailed(kUnavailable, clock.Now()).action, Action::kReturn);
}

TEST(JoinRetryPolicyTest, WaitingPollsAtTheServersIntervalAndAtLeast1Ms) {
  common::FakeClock clock;
  JoinRetryPolicy policy(Options(absl::Seconds(1)), clock.Now());
  JoinRetryPolicy::Step step = policy.OnWaiting(250, clock.Now());
  EXPECT_EQ(step.action, Action::kPollAgain);
  EXPECT_EQ(step.wait, absl::Milliseconds(250));
  EXPECT_EQ(policy.OnWaiting(0, clock.Now()).wait, absl::Milliseconds(1));
  EXPECT_EQ(policy.OnWaiting(-5, clock.Now()).wait, absl::Milliseconds(1));
}

// A server that answers `waiting` was heard: an outage after it gets the
// whole unreachable timeout again, and the backoff starts over.
TEST(JoinRetryPolicyTest, AWaitingAnswerStartsTheBoundAndTheBackoffOver) {
  common::FakeClock clock;
  JoinRetryPolicy policy(Options(absl::Seconds(1)), clock.Now());
  for (int i = 0; i < 3; ++i) {
    clock.Advance(policy.OnFailed(kUnavailable, clock.Now()).wait);
  }
  clock.Advance(absl::Milliseconds(250));  // 950 ms since the start
  ASSERT_EQ(policy.OnWaiting(100, clock.Now()).action, Action::kPollAgain);
  clock.Advance(absl::Milliseconds(100));
  const absl::Time heard = clock.Now() - absl::Milliseconds(100);
  EXPECT_EQ(policy.give_up(), heard + absl::Seconds(1));

  std::vector<absl::Duration> waits = RetryUntilGivenUp(policy, clock);

  EXPECT_THAT(waits,
              ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(400), absl::Milliseconds(200)));
  EXPECT_EQ(clock.Now(), heard + absl::Seconds(1));
}

TEST(JoinRetryPolicyTest, TheUnreachableTimeoutIsReadTimeoutBoundedByJoin) {
  EXPECT_EQ(JoinRetryPolicy::UnreachableTimeout(absl::Seconds(600),
                                                absl::Seconds(60)),
            absl::Seconds(60));
  EXPECT_EQ(
      JoinRetryPolicy::UnreachableTimeout(absl::Seconds(30), absl::Seconds(60)),
      absl::Seconds(30));
}

TEST(JoinRetryPolicyTest, AParkedJoinIsAwaitedPastTheServersTimeout) {
  EXPECT_GT(JoinRetryPolicy::AnswerBound(absl::Seconds(600)),
            absl::Seconds(600));
}

}  // namespace
}  // namespace ddprun::launcher
