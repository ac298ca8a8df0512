// common::Backoff, the one retry pacing: capped exponential delays, each
// scaled by a jitter factor within its bounds, and Reset back to the start.
#include "common/backoff.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ddprun::common {
namespace {

TEST(BackoffTest, WithoutJitterTheDelaysDoubleUpToTheCap) {
  Backoff backoff({.initial = absl::Milliseconds(20),
                   .max = absl::Milliseconds(150),
                   .multiplier = 2.0,
                   .jitter = 0.0});
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(20));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(40));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(80));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(150));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(150));
}

TEST(BackoffTest, ResetStartsAgainFromTheInitialDelay) {
  Backoff backoff({.initial = absl::Milliseconds(10),
                   .max = absl::Seconds(1),
                   .multiplier = 3.0,
                   .jitter = 0.0});
  backoff.Next();
  backoff.Next();
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(30));
}

TEST(BackoffTest, JitterStaysWithinItsBoundsAndVaries) {
  const BackoffOptions options = {.initial = absl::Milliseconds(100),
                                  .max = absl::Milliseconds(100),
                                  .multiplier = 2.0,
                                  .jitter = 0.2};
  Backoff backoff(options);
  absl::Duration low = absl::InfiniteDuration();
  absl::Duration high = absl::ZeroDuration();
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration delay = backoff.Next();
    ASSERT_GE(delay, absl::Milliseconds(80));
    ASSERT_LE(delay, absl::Milliseconds(120));
    low = std::min(low, delay);
    high = std::max(high, delay);
  }
  // 1000 uniform draws over a 40 ms range: all within 1 ms of one value
  // has a probability below 1e-1000, so this cannot flake.
  EXPECT_GT(high - low, absl::Milliseconds(1));
}

TEST(BackoffTest, TheDefaultsAreTheDocumentedOnes) {
  const BackoffOptions defaults;
  EXPECT_EQ(defaults.initial, absl::Milliseconds(20));
  EXPECT_EQ(defaults.max, absl::Seconds(2));
  Backoff backoff;
  // 20 ms first, within its jitter.
  const absl::Duration first = backoff.Next();
  EXPECT_GE(first, absl::Milliseconds(16));
  EXPECT_LE(first, absl::Milliseconds(24));
}

}  // namespace
}  // namespace ddprun::common
