// PollPacing's rules on a fake clock: the interval, the spread after the
// expected close, the close's two expectations and the polling timeout.
#include "rendezvous/core/poll_pacing.h"

#include <gtest/gtest.h>

#include <optional>

#include "common/clock.h"
#include "rendezvous/core/heartbeat_scaling.h"

namespace ddprun::rendezvous {
namespace {

v1::JobConfig Config(int max_nodes = 100) {
  v1::JobConfig config;
  config.set_min_nodes(1);
  config.set_max_nodes(max_nodes);
  config.set_last_call_timeout_ms(2000);
  config.set_heartbeat_interval_ms(1000);
  config.set_heartbeat_timeout_ms(6000);
  return config;
}

PollPacingOptions Options() {
  PollPacingOptions options;
  options.budget_per_s = 100;
  options.min_interval = absl::Milliseconds(250);
  options.min_timeout = absl::ZeroDuration();
  options.max_delay = absl::Seconds(10);
  return options;
}

TEST(PollPacingTest, IntervalKeepsThePollsWithinTheBudget) {
  PollPacing pacing(Options(), Config(), /*heartbeat_budget_per_s=*/0);
  EXPECT_EQ(pacing.IntervalMs(0), 250);   // never under min_interval
  EXPECT_EQ(pacing.IntervalMs(25), 250);  // 25 polls / 250 ms = the budget
  EXPECT_EQ(pacing.IntervalMs(50), 500);
  EXPECT_EQ(pacing.IntervalMs(1001), 10010);  // rounded up
  PollPacingOptions no_budget = Options();
  no_budget.budget_per_s = 0;
  no_budget.min_interval = absl::ZeroDuration();
  EXPECT_EQ(PollPacing(no_budget, Config(), 0).IntervalMs(1000000), 1);
}

TEST(PollPacingTest, WithoutAnExpectedCloseANodePollsAfterOneInterval) {
  common::FakeClock clock;
  PollPacing pacing(Options(), Config(), 0);
  EXPECT_EQ(pacing.DelayMs(clock.Now(), std::nullopt, 50), 500);
  EXPECT_EQ(pacing.TakeToldClose(), std::nullopt);
}

TEST(PollPacingTest, TheLastCallIsTheExpectedClose) {
  common::FakeClock clock;
  PollPacing pacing(Options(), Config(), 0);
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), std::nullopt, 3), std::nullopt);
  const absl::Time min_reached = clock.Now();
  clock.Advance(absl::Milliseconds(500));
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), min_reached, 3),
            min_reached + absl::Seconds(2));
}

TEST(PollPacingTest, AFullRoundIsExpectedAtTheArrivalRate) {
  common::FakeClock clock;
  PollPacing pacing(Options(), Config(/*max_nodes=*/20), 0);
  // Seven arrivals give no rate yet.
  for (int i = 0; i < 7; ++i) {
    pacing.Arrived(clock.Now());
    clock.Advance(absl::Milliseconds(100));
  }
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), std::nullopt, 7), std::nullopt);
  // The 8th: 7 arrivals in 700 ms, 10 per second; 12 more take 1.2 s.
  pacing.Arrived(clock.Now());
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), std::nullopt, 8),
            clock.Now() + absl::Milliseconds(1200));
  // The last call, when sooner, wins.
  EXPECT_EQ(
      pacing.ExpectedClose(clock.Now(), clock.Now() - absl::Seconds(1), 8),
      clock.Now() + absl::Seconds(1));
  // A full round expects nothing more from the rate.
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), std::nullopt, 20), std::nullopt);
  // A new round counts arrivals anew.
  pacing.RoundFormed();
  pacing.Arrived(clock.Now());
  EXPECT_EQ(pacing.ExpectedClose(clock.Now(), std::nullopt, 1), std::nullopt);
}

TEST(PollPacingTest, WaitingNodesAreSpreadOverOneIntervalAfterTheClose) {
  common::FakeClock clock;
  PollPacing pacing(Options(), Config(), 0);
  const absl::Time close = clock.Now() + absl::Seconds(2);
  // 50 polling nodes: a 500 ms interval, one place every 10 ms.
  EXPECT_EQ(pacing.DelayMs(clock.Now(), close, 50), 2000);
  EXPECT_EQ(pacing.DelayMs(clock.Now(), close, 50), 2010);
  EXPECT_EQ(pacing.DelayMs(clock.Now(), close, 50), 2020);
  // The first close told is kept for the log, once.
  EXPECT_EQ(pacing.TakeToldClose(), close);
  EXPECT_EQ(pacing.TakeToldClose(), std::nullopt);
}

TEST(PollPacingTest, TheDelayStaysBetweenTheMinimumIntervalAndTheMaximum) {
  common::FakeClock clock;
  PollPacingOptions options = Options();
  options.max_delay = absl::Seconds(5);
  PollPacing pacing(options, Config(), 0);
  // A close already past: not sooner than min_interval.
  EXPECT_EQ(pacing.DelayMs(clock.Now(), clock.Now() - absl::Seconds(1), 1),
            250);
  // A far close: at most max_delay.
  EXPECT_EQ(pacing.DelayMs(clock.Now(), clock.Now() + absl::Minutes(1), 1),
            5000);
  // A close between: rounded up to the millisecond.
  EXPECT_EQ(
      pacing.DelayMs(clock.Now(), clock.Now() + absl::Microseconds(700500), 1),
      701);
}

TEST(PollPacingTest, TimeoutIsOneIntervalPastTheHeartbeatTimeout) {
  PollPacing pacing(Options(), Config(), /*heartbeat_budget_per_s=*/1000);
  // 6 s of heartbeat timeout after a 250 ms interval.
  EXPECT_EQ(pacing.Timeout(250, 10), absl::Milliseconds(6250));
  // Never under three intervals.
  EXPECT_EQ(pacing.Timeout(5000, 10), absl::Milliseconds(15000));
  // 4,000 waiting nodes would heartbeat every 4 s: the timeout grows 4x.
  EXPECT_EQ(pacing.Timeout(250, 4000), absl::Milliseconds(24250));
  // And never under min_timeout.
  PollPacingOptions options = Options();
  options.min_timeout = absl::Seconds(30);
  EXPECT_EQ(PollPacing(options, Config(), 1000).Timeout(250, 10),
            absl::Seconds(30));
}

TEST(HeartbeatScalingTest, ALargeRoundBeatsLessOftenWithALongerTimeout) {
  // Within the budget: as configured.
  HeartbeatTiming timing = ScaleHeartbeats(1000, 6000, 1000, 1000);
  EXPECT_EQ(timing.interval_ms, 1000);
  EXPECT_EQ(timing.timeout_ms, 6000);
  // 2,500 nodes at 1,000 beats/s: every 2.5 s, timeout 15 s.
  timing = ScaleHeartbeats(1000, 6000, 2500, 1000);
  EXPECT_EQ(timing.interval_ms, 2500);
  EXPECT_EQ(timing.timeout_ms, 15000);
  // Rounded up: 1,001 nodes need 1,001 ms.
  timing = ScaleHeartbeats(1000, 3001, 1001, 1000);
  EXPECT_EQ(timing.interval_ms, 1001);
  EXPECT_EQ(timing.timeout_ms, 3005);
  // No budget, or no interval: unchanged.
  timing = ScaleHeartbeats(1000, 6000, 1000000, 0);
  EXPECT_EQ(timing.interval_ms, 1000);
  timing = ScaleHeartbeats(0, 6000, 1000000, 1000);
  EXPECT_EQ(timing.timeout_ms, 6000);
}

TEST(HeartbeatScalingTest, ALargeRoundSendsItsFiguresLessOften) {
  // Within the budget (250 figures messages/s): once a second.
  EXPECT_EQ(ScaleFiguresInterval(1000, 250, 250), 1000);
  // 1,000 nodes: every 4 s; 1,001: rounded up.
  EXPECT_EQ(ScaleFiguresInterval(1000, 1000, 250), 4000);
  EXPECT_EQ(ScaleFiguresInterval(1000, 1001, 250), 4004);
  // No budget, or no interval: unchanged.
  EXPECT_EQ(ScaleFiguresInterval(1000, 100000, 0), 1000);
  EXPECT_EQ(ScaleFiguresInterval(0, 100000, 250), 0);
}

}  // namespace
}  // namespace ddprun::rendezvous
