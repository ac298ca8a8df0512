// When the server gives back the memory of a large fan-out (MemoryReturn),
// with time, call counts and the answers waiting for polls passed in.
#include "rendezvous/core/memory_return.h"

#include "gtest/gtest.h"

namespace ddprun::rendezvous {
namespace {

class MemoryReturnTest : public ::testing::Test {
 protected:
  // One 10 ms tick: `parked` now (and at most since the last tick),
  // `new_calls` more Join calls, `for_poll` answers waiting for polls.
  bool Tick(size_t parked, int64_t new_calls = 0, int64_t for_poll = 0) {
    now_ += absl::Milliseconds(10);
    calls_ += new_calls;
    return policy_.Tick(now_, FanOutState{.parked = parked,
                                          .peak_parked = parked,
                                          .join_calls = calls_,
                                          .answers_for_poll = for_poll});
  }
  // Ticks for `d` with `calls_per_s` Join calls coming in; how many trims.
  int Run(absl::Duration d, int64_t calls_per_s, int64_t for_poll = 0) {
    int trims = 0;
    for (absl::Duration t; t < d; t += absl::Milliseconds(10)) {
      trims += Tick(0, calls_per_s / 100, for_poll) ? 1 : 0;
    }
    return trims;
  }

  MemoryReturn policy_{MemoryReturnOptions{.large_fan_out = 10000}};
  absl::Time now_ = absl::UnixEpoch();
  int64_t calls_ = 0;
};

TEST_F(MemoryReturnTest, SmallFanOutsAreNotTrimmed) {
  EXPECT_FALSE(Tick(9000));
  EXPECT_EQ(Run(absl::Seconds(60), 0), 0) << "9,000 parked: below 10,000";
}

TEST_F(MemoryReturnTest, WaitsForTheCollectingPollsToEnd) {
  EXPECT_FALSE(Tick(16384, 16384, 83616));
  // The close: the parked calls are answered. The first polls come late
  // (a loaded host): no Join for 2 s, yet 83,616 answers wait for polls.
  EXPECT_EQ(Run(absl::Seconds(2), 0, 83616), 0)
      << "the fan-out is not over while answers wait for their polls";
  // The polls at 20,000/s for ~4 s.
  EXPECT_EQ(Run(absl::Seconds(4), 20000, 1000), 0)
      << "a trim in the midst of the polls costs every one of them";
  // Every answer collected, yet the Joins still come: not yet.
  EXPECT_EQ(Run(absl::Milliseconds(900), 20000, 0), 0);
  // The Joins are over: the first quiet window trims.
  int first_after_ms = -1;
  for (int ms = 10; ms <= 2000; ms += 10) {
    if (Tick(0)) {
      first_after_ms = ms;
      break;
    }
  }
  EXPECT_GT(first_after_ms, 0) << "no trim once the fan-out ended";
  // Then two more, 4 s and 19 s after the first, and no more.
  EXPECT_EQ(Run(absl::Seconds(3.9), 0), 0);
  EXPECT_EQ(Run(absl::Milliseconds(200), 0), 1);
  EXPECT_EQ(Run(absl::Seconds(14.8), 0), 0);
  EXPECT_EQ(Run(absl::Milliseconds(200), 0), 1);
  EXPECT_EQ(Run(absl::Seconds(60), 0), 0) << "three trims per fan-out";
}

TEST_F(MemoryReturnTest, TrimsWithinTheMaximumWaitWhenTheFanOutDrags) {
  EXPECT_FALSE(Tick(20000));
  // Answers wait for polls that never come (their nodes died; they are
  // dropped only at their poll timeout), Joins keep coming: the memory
  // still goes back, at most 30 s after the fan-out.
  EXPECT_EQ(Run(absl::Seconds(29.9), 5000, 10), 0);
  EXPECT_EQ(Run(absl::Milliseconds(200), 5000, 10), 1);
}

TEST_F(MemoryReturnTest, ALaterFanOutIsTrimmedAgain) {
  EXPECT_FALSE(Tick(12000));
  EXPECT_EQ(Run(absl::Seconds(30), 0), 3);
  // A second round of the job parks and closes.
  EXPECT_FALSE(Tick(12000, 12000));
  EXPECT_EQ(Run(absl::Seconds(30), 0), 3);
}

TEST_F(MemoryReturnTest, CountsAnswersForPollOnlyWhileItWaitsForTheEnd) {
  EXPECT_FALSE(policy_.wants_answers_for_poll());
  EXPECT_FALSE(Tick(12000));
  EXPECT_FALSE(Tick(0));  // the fan-out
  EXPECT_TRUE(policy_.wants_answers_for_poll());
  EXPECT_EQ(Run(absl::Seconds(2), 0), 1);
  EXPECT_FALSE(policy_.wants_answers_for_poll()) << "trimmed once already";
}

TEST_F(MemoryReturnTest, NeverWhenOff) {
  MemoryReturn off(MemoryReturnOptions{.large_fan_out = 0});
  EXPECT_FALSE(
      off.Tick(now_, FanOutState{.parked = 100000, .peak_parked = 100000}));
  EXPECT_FALSE(off.Tick(now_ + absl::Seconds(60), FanOutState{}));
}

}  // namespace
}  // namespace ddprun::rendezvous
