// The server's ticker: when it runs its next tick (NextTickAt, a pure
// function), that it sleeps instead of polling, and that WakeBy shortens a
// sleep; the job table's deadlines it is told (JobTable::Tick, wake_by).
#include "rendezvous/core/ticker.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

constexpr absl::Duration kMin = absl::Milliseconds(10);
constexpr absl::Duration kMax = absl::Milliseconds(500);

TEST(NextTickAtTest, SleepsUntilTheDeadlineBetweenTheBounds) {
  const TickerOptions options{.min_period = kMin, .max_sleep = kMax};
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  // A deadline in between: exactly then.
  EXPECT_EQ(NextTickAt(t0, t0 + absl::Milliseconds(120), options),
            t0 + absl::Milliseconds(120));
  // Nothing due: the cap, not the period.
  EXPECT_EQ(NextTickAt(t0, absl::InfiniteFuture(), options), t0 + kMax);
  // Due now or past (a burst): batched, one period after the last tick.
  EXPECT_EQ(NextTickAt(t0, absl::InfinitePast(), options), t0 + kMin);
  EXPECT_EQ(NextTickAt(t0, t0 + absl::Milliseconds(3), options), t0 + kMin);
  // A cap below the period is the period.
  const TickerOptions odd{.min_period = kMin,
                          .max_sleep = absl::ZeroDuration()};
  EXPECT_EQ(NextTickAt(t0, absl::InfiniteFuture(), odd), t0 + kMin);
}

TEST(TickerTest, IdleTickerSleepsItsWholeCapAndWakeByShortensIt) {
  common::FakeClock clock;
  Ticker ticker(&clock, {.min_period = kMin, .max_sleep = absl::Hours(1)});
  ticker.Start([] { return absl::InfiniteFuture(); });
  ASSERT_TRUE(
      testing::WaitFor([&] { return ticker.ticks() == 1; }, absl::Seconds(10)));
  ASSERT_TRUE(testing::WaitFor(
      [&] { return ticker.PlannedSleepForTest() == absl::Hours(1); },
      absl::Seconds(10)));
  // Idle: no second tick (a polling ticker would tick every 10 ms).
  EXPECT_FALSE(testing::WaitFor([&] { return ticker.ticks() > 1; },
                                absl::Milliseconds(300)));
  // A deadline 50 ms away wakes it well before the hour is up.
  ticker.WakeBy(clock.Now() + absl::Milliseconds(50));
  EXPECT_TRUE(
      testing::WaitFor([&] { return ticker.ticks() == 2; }, absl::Seconds(20)))
      << "WakeBy did not shorten the sleep";
  ticker.Stop();
}

TEST(TickerTest, SleepsUntilTheDeadlineTheTickReturned) {
  common::FakeClock clock;
  absl::Mutex mu;
  std::vector<absl::Time> wanted = {clock.Now() + absl::Milliseconds(40),
                                    absl::InfiniteFuture()};
  Ticker ticker(&clock, {.min_period = kMin, .max_sleep = absl::Hours(1)});
  ticker.Start([&] {
    absl::MutexLock lock(&mu);
    absl::Time next = wanted.front();
    if (wanted.size() > 1) wanted.erase(wanted.begin());
    return next;
  });
  EXPECT_TRUE(
      testing::WaitFor([&] { return ticker.ticks() >= 2; }, absl::Seconds(20)))
      << "the deadline the first tick returned was not served";
  ticker.Stop();
  EXPECT_EQ(ticker.ticks(), 2);
}

TEST(TickerTest, StopEndsALongSleepAtOnce) {
  common::FakeClock clock;
  Ticker ticker(&clock, {.min_period = kMin, .max_sleep = absl::Hours(1)});
  ticker.Start([] { return absl::InfiniteFuture(); });
  ASSERT_TRUE(
      testing::WaitFor([&] { return ticker.ticks() == 1; }, absl::Seconds(10)));
  ticker.Stop();  // would block for an hour if the sleep ignored it
  EXPECT_EQ(ticker.ticks(), 1);
}

// The job table returns its jobs' next deadline from Tick and tells
// wake_by when a call sets an earlier one.
TEST(JobTableDeadlineTest, AParkedJoinAnnouncesItsJoinDeadline) {
  common::FakeClock clock;
  std::vector<absl::Time> announced;
  JobTableOptions options;
  options.wake_by = [&](absl::Time t) { announced.push_back(t); };
  JobTable table(&clock, options);
  Effects effects;
  EXPECT_EQ(table.Tick(&effects), absl::InfiniteFuture()) << "no job yet";

  v1::JoinRequest request;
  request.set_run_id("job");
  request.set_node_id("a");
  request.set_local_world_size(1);
  request.set_node_rank(-1);
  request.set_address("addr-a");
  request.set_master_port(1000);
  request.mutable_config()->set_min_nodes(2);
  request.mutable_config()->set_max_nodes(2);
  request.mutable_config()->set_join_timeout_ms(300);
  table.Join(request, /*waiter=*/1, &effects);
  const absl::Time deadline = clock.Now() + absl::Milliseconds(300);
  ASSERT_FALSE(announced.empty());
  EXPECT_LE(announced.back(), deadline);

  // The first tick scans; afterwards the join deadline is what is due.
  absl::Time next = table.Tick(&effects);
  EXPECT_EQ(next, deadline);
  clock.Advance(absl::Milliseconds(300));
  table.Tick(&effects);
  ASSERT_EQ(effects.joins.size(), 1u);
  EXPECT_EQ(effects.joins[0].response.status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace ddprun::rendezvous
