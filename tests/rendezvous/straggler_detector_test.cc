// The straggler rules with a fake clock: who is named, when, and who never is.
#include "rendezvous/core/straggler_detector.h"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::rendezvous {
namespace {

constexpr absl::Duration kWindow = absl::Seconds(1);

class StragglerDetectorTest : public ::testing::Test {
 protected:
  // Every rank reports `compute_s[rank]`, then one window is evaluated.
  std::vector<StragglerDetector::Change> Window(
      const std::vector<double>& compute_s, int samples = 10) {
    for (int rank = 0; rank < static_cast<int>(compute_s.size()); ++rank) {
      RankSample sample;
      sample.node_id = "node" + std::to_string(rank / 2);
      sample.local_rank = rank % 2;
      sample.samples = samples;
      sample.compute_s = compute_s[rank];
      detector_.Report(rank, sample, now_);
    }
    auto changes = detector_.Evaluate(now_);
    now_ += kWindow;
    return changes;
  }

  absl::Time now_ = absl::UnixEpoch() + absl::Hours(1);
  StragglerDetector detector_{StragglerOptions{}};
};

TEST_F(StragglerDetectorTest, NamesARankSlowForThreeWindowsInARow) {
  EXPECT_TRUE(Window({0.01, 0.01, 0.03, 0.01}).empty());
  EXPECT_TRUE(Window({0.01, 0.01, 0.03, 0.01}).empty());
  EXPECT_TRUE(detector_.stragglers().empty());
  auto changes = Window({0.01, 0.01, 0.03, 0.01});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_TRUE(changes[0].named);
  EXPECT_EQ(changes[0].straggler.rank, 2);
  EXPECT_EQ(changes[0].straggler.sample.node_id, "node1");
  EXPECT_EQ(changes[0].straggler.sample.local_rank, 0);
  EXPECT_DOUBLE_EQ(changes[0].straggler.job_median_s, 0.01);
  EXPECT_DOUBLE_EQ(changes[0].straggler.ratio, 3);
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  EXPECT_EQ(detector_.stragglers()[0].rank, 2);
}

TEST_F(StragglerDetectorTest, TwoRanksCompareWithEachOther) {
  // Twice as slow as its only peer: 1.33x the pair's median, but 2x the
  // other's.
  for (int i = 0; i < 3; ++i) Window({0.01, 0.02});
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  EXPECT_EQ(detector_.stragglers()[0].rank, 1);
}

TEST_F(StragglerDetectorTest, OneSlowWindowInBetweenNamesNobody) {
  for (int i = 0; i < 10; ++i) {
    const bool slow = i % 3 == 1;
    EXPECT_TRUE(Window({0.01, slow ? 0.05 : 0.01, 0.011}).empty()) << i;
  }
  EXPECT_TRUE(detector_.stragglers().empty());
}

TEST_F(StragglerDetectorTest, BelowTheFactorIsNotSlow) {
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Window({0.01, 0.014, 0.01}).empty());
}

TEST_F(StragglerDetectorTest, ClearedAfterAsManyFineWindows) {
  for (int i = 0; i < 3; ++i) Window({0.01, 0.05, 0.01});
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  EXPECT_TRUE(Window({0.01, 0.01, 0.01}).empty());
  EXPECT_TRUE(Window({0.01, 0.01, 0.01}).empty());
  auto changes = Window({0.01, 0.01, 0.01});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_FALSE(changes[0].named);
  EXPECT_TRUE(detector_.stragglers().empty());
}

TEST_F(StragglerDetectorTest, EvaluatesOncePerWindow) {
  Window({0.01, 0.05, 0.01});
  Window({0.01, 0.05, 0.01});
  // Many evaluations within one window count once.
  now_ -= kWindow / 2;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(detector_.Evaluate(now_).empty());
  EXPECT_TRUE(detector_.stragglers().empty());
}

TEST_F(StragglerDetectorTest, TooFewSamplesOrStaleFiguresDoNotCount) {
  for (int i = 0; i < 5; ++i) Window({0.01, 0.05, 0.01}, /*samples=*/2);
  EXPECT_TRUE(detector_.stragglers().empty());
  for (int i = 0; i < 3; ++i) Window({0.01, 0.05, 0.01});
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  // Nobody reports any more: the figures go stale and the rank is cleared.
  for (int i = 0; i < 10; ++i) {
    detector_.Evaluate(now_);
    now_ += kWindow;
  }
  EXPECT_TRUE(detector_.stragglers().empty());
}

TEST_F(StragglerDetectorTest, FiguresStayFreshForTwoAndAHalfReportIntervals) {
  // A large job's nodes send figures every 4 s: figures 9 s old still
  // count (the default max_age, 5 s, would leave every rank stale between
  // two reports); past 10 s they do not.
  detector_.SetReportInterval(absl::Seconds(4));
  EXPECT_EQ(detector_.max_age(), absl::Seconds(10));
  for (int i = 0; i < 3; ++i) Window({0.01, 0.05, 0.01});
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  // Nobody reports for 9 windows: still named (fresh, and slow).
  for (int i = 0; i < 8; ++i) {
    detector_.Evaluate(now_);
    now_ += kWindow;
  }
  EXPECT_EQ(detector_.stragglers().size(), 1u);
  for (int i = 0; i < 5; ++i) {
    detector_.Evaluate(now_);
    now_ += kWindow;
  }
  EXPECT_TRUE(detector_.stragglers().empty()) << "stale after 10 s";
  // A short interval never shortens max_age below its option.
  detector_.SetReportInterval(absl::Seconds(1));
  EXPECT_EQ(detector_.max_age(), StragglerOptions{}.max_age);
}

TEST_F(StragglerDetectorTest, FactorZeroNamesNobody) {
  StragglerOptions options;
  options.factor = 0;
  detector_ = StragglerDetector(options);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Window({0.01, 0.1, 0.01}).empty());
}

TEST_F(StragglerDetectorTest, ResetForgetsTheRound) {
  for (int i = 0; i < 3; ++i) Window({0.01, 0.05, 0.01});
  ASSERT_EQ(detector_.stragglers().size(), 1u);
  detector_.Reset();
  EXPECT_TRUE(detector_.stragglers().empty());
  EXPECT_DOUBLE_EQ(detector_.job_median_s(), 0);
}

TEST_F(StragglerDetectorTest, ReportsAtMostMaxReportedSlowestFirst) {
  StragglerOptions options;
  options.max_reported = 2;
  detector_ = StragglerDetector(options);
  std::vector<double> figures(20, 0.01);
  figures[3] = 0.03;
  figures[7] = 0.05;
  figures[9] = 0.04;
  for (int i = 0; i < 3; ++i) Window(figures);
  auto named = detector_.stragglers();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].rank, 7);
  EXPECT_EQ(named[1].rank, 9);
}

}  // namespace
}  // namespace ddprun::rendezvous
