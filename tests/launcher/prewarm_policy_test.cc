#include "launcher/agent/prewarm_policy.h"

#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

TEST(ZygoteDelayTest, ACpuToSpareStartsTheZygoteAtOnce) {
  ZygoteTimingOptions options;
  options.nproc_per_node = 2;
  options.usable_cpus = 3;
  EXPECT_EQ(ZygoteDelay(options, absl::Seconds(5)), absl::ZeroDuration());
}

TEST(ZygoteDelayTest, WorkersFillingEveryCpuWaitThreeProgramStarts) {
  ZygoteTimingOptions options;
  options.nproc_per_node = 2;
  options.usable_cpus = 2;
  EXPECT_EQ(ZygoteDelay(options, absl::Milliseconds(400)),
            absl::Milliseconds(1200));
  options.nproc_per_node = 8;  // more workers than CPUs
  EXPECT_EQ(ZygoteDelay(options, absl::Milliseconds(400)),
            absl::Milliseconds(1200));
}

TEST(ZygoteDelayTest, UnknownCpusCountAsNoneToSpare) {
  ZygoteTimingOptions options;
  options.nproc_per_node = 1;
  options.usable_cpus = 0;
  EXPECT_EQ(ZygoteDelay(options, absl::Seconds(1)), absl::Seconds(3));
}

TEST(ZygoteDelayTest, ASlowStartWaitsAtMostTheCap) {
  ZygoteTimingOptions options;
  options.nproc_per_node = 4;
  options.usable_cpus = 4;
  EXPECT_EQ(ZygoteDelay(options, absl::Minutes(2)), absl::Seconds(60));
  // A clock that went backwards is no start at all.
  EXPECT_EQ(ZygoteDelay(options, -absl::Seconds(1)), absl::ZeroDuration());
}

}  // namespace
}  // namespace ddprun::launcher
