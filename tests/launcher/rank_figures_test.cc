// What an agent's heartbeats say of its ranks: phases, steps, rates and
// compute-time figures over the window.
#include "launcher/agent/rank_figures.h"

#include <gtest/gtest.h>

namespace ddprun::launcher {
namespace {

common::ProgressRecord Step(std::optional<double> compute_s) {
  common::ProgressRecord record;
  record.kind = common::ProgressRecord::Kind::kStep;
  record.compute_seconds = compute_s;
  return record;
}

TEST(RankFiguresTest, SummarisesTheWindowPerRank) {
  const absl::Time start = absl::UnixEpoch() + absl::Hours(1);
  RankFigures figures(2, start);
  absl::Time now = start;
  // Rank 0: 100 steps of 10 ms and one of 500 ms (a burst of throttling).
  for (int i = 0; i < 100; ++i) {
    now += absl::Milliseconds(10);
    figures.OnRecord(0, Step(0.010), now);
  }
  figures.OnRecord(0, Step(0.5), now);
  figures.OnRecord(1, Step(std::nullopt), now);  // an older worker
  figures.SetPhase(0, common::Phase::kStep);
  figures.SetPhase(1, common::Phase::kCheckpoint);
  std::vector<v1::RankFigures> summary = figures.Summary(now);
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_EQ(summary[0].local_rank(), 0);
  EXPECT_EQ(summary[0].phase(), "step");
  EXPECT_EQ(summary[0].steps(), 101);
  EXPECT_EQ(summary[0].samples(), 101);
  EXPECT_DOUBLE_EQ(summary[0].compute_median_s(), 0.010);
  EXPECT_DOUBLE_EQ(summary[0].compute_p99_s(), 0.010);
  EXPECT_NEAR(summary[0].compute_mean_s(), (1.0 + 0.5) / 101, 1e-12);
  // 101 steps in the round's first second.
  EXPECT_NEAR(summary[0].steps_per_s(), 101, 1e-9);
  EXPECT_EQ(summary[1].phase(), "checkpoint");
  EXPECT_EQ(summary[1].steps(), 1);
  EXPECT_EQ(summary[1].samples(), 0);
  EXPECT_EQ(summary[1].compute_mean_s(), 0);
}

TEST(RankFiguresTest, OldRecordsLeaveTheWindow) {
  const absl::Time start = absl::UnixEpoch();
  RankFiguresOptions options;
  options.window = absl::Seconds(2);
  RankFigures figures(1, start, options);
  figures.OnRecord(0, Step(1.0), start + absl::Seconds(1));
  for (int i = 0; i < 4; ++i) {
    figures.OnRecord(0, Step(0.1), start + absl::Seconds(4));
  }
  std::vector<v1::RankFigures> summary =
      figures.Summary(start + absl::Seconds(4));
  EXPECT_EQ(summary[0].steps(), 5);
  EXPECT_EQ(summary[0].samples(), 4);
  EXPECT_DOUBLE_EQ(summary[0].compute_p99_s(), 0.1);
  EXPECT_NEAR(summary[0].steps_per_s(), 2, 1e-9);  // 4 steps in 2 s
  // Nothing for longer than the window: no rate, no figures.
  summary = figures.Summary(start + absl::Seconds(10));
  EXPECT_EQ(summary[0].steps_per_s(), 0);
  EXPECT_EQ(summary[0].samples(), 0);
}

// Steps count from the rank's start of stepping in the round, as the
// supervisor counts them: a survivor's step record of the round before,
// read at this round's start, is not one. The heartbeats send the most.
TEST(RankFiguresTest, StepsCountFromTheRoundsStartOfStepping) {
  RankFigures figures(2, absl::UnixEpoch());
  const absl::Time now = absl::UnixEpoch() + absl::Seconds(1);
  figures.OnRecord(0, Step(0.01), now);  // the round before's, read late
  EXPECT_EQ(figures.MostSteps().value, 1);
  for (common::Phase phase : {common::Phase::kJoin, common::Phase::kSync,
                              common::Phase::kFirstStep}) {
    figures.OnRecord(
        0, {.kind = common::ProgressRecord::Kind::kPhase, .phase = phase}, now);
  }
  EXPECT_EQ(figures.MostSteps().value, 0);
  for (int i = 0; i < 3; ++i) figures.OnRecord(0, Step(0.01), now);
  figures.OnRecord(1, Step(0.01), now);
  figures.OnRecord(1,
                   {.kind = common::ProgressRecord::Kind::kPhase,
                    .phase = common::Phase::kEval},
                   now);  // an evaluation does not reset the count
  figures.OnRecord(1, Step(0.01), now);
  EXPECT_EQ(figures.MostSteps().value, 3);
  EXPECT_EQ(figures.Summary(now)[1].steps(), 2);
}

// The heartbeats date the most steps by the first rank that got there: it
// has waited in its sync for the others since.
TEST(RankFiguresTest, TheMostStepsAreDatedByTheFirstRankThere) {
  RankFigures figures(3, absl::UnixEpoch());
  const absl::Time t0 = absl::UnixEpoch() + absl::Seconds(1);
  figures.OnRecord(1, Step(0.01), t0);
  figures.OnRecord(2, Step(0.01), t0 + absl::Milliseconds(5));
  figures.OnRecord(2, Step(0.01), t0 + absl::Milliseconds(20));
  figures.OnRecord(0, Step(0.01), t0 + absl::Milliseconds(30));
  figures.OnRecord(1, Step(0.01), t0 + absl::Milliseconds(40));
  EXPECT_EQ(figures.MostSteps().value, 2);
  EXPECT_EQ(figures.MostSteps().reached, t0 + absl::Milliseconds(20));
  figures.OnRecord(0, Step(0.01), t0 + absl::Milliseconds(50));
  figures.OnRecord(0, Step(0.01), t0 + absl::Milliseconds(60));
  EXPECT_EQ(figures.MostSteps().value, 3);
  EXPECT_EQ(figures.MostSteps().reached, t0 + absl::Milliseconds(60));
}

// How far a rank got through the round's state sync: the collectives it
// entered, one more once it left the sync, counted from its sync record of
// this round only, and dated by the first rank there.
TEST(RankFiguresTest, TheSyncCountsCollectivesFromTheRoundsSyncRecord) {
  using Kind = common::ProgressRecord::Kind;
  const common::ProgressRecord sync{.kind = Kind::kPhase,
                                    .phase = common::Phase::kSync};
  const common::ProgressRecord first_step{.kind = Kind::kPhase,
                                          .phase = common::Phase::kStep};
  const common::ProgressRecord join{.kind = Kind::kPhase,
                                    .phase = common::Phase::kJoin};
  const common::ProgressRecord collective{.kind = Kind::kCollective};
  const common::ProgressRecord done{.kind = Kind::kCollectiveDone};
  RankFigures figures(2, absl::UnixEpoch());
  const absl::Time t0 = absl::UnixEpoch() + absl::Seconds(1);
  auto at = [t0](int ms) { return t0 + absl::Milliseconds(ms); };
  // A survivor's collective and first step of the round before, read at
  // this round's start: no sync record came, nothing counts.
  figures.OnRecord(0, collective, at(0));
  figures.OnRecord(0, first_step, at(1));
  EXPECT_EQ(figures.MostSync().value, 0);

  for (int r : {0, 1}) figures.OnRecord(r, sync, at(2));
  EXPECT_EQ(figures.MostSync().value, 0);
  figures.OnRecord(1, collective, at(10));
  figures.OnRecord(0, collective, at(12));
  EXPECT_EQ(figures.MostSync().value, 1);
  EXPECT_EQ(figures.MostSync().reached, at(10)) << "the first rank there";
  figures.OnRecord(1, done, at(20));  // completing one is no further
  EXPECT_EQ(figures.MostSync().value, 1);
  figures.OnRecord(0, done, at(21));
  figures.OnRecord(0, collective, at(30));
  EXPECT_EQ(figures.MostSync().value, 2);
  EXPECT_EQ(figures.MostSync().reached, at(30));
  figures.OnRecord(0, done, at(40));
  figures.OnRecord(0, first_step, at(50));  // finished the sync
  EXPECT_EQ(figures.MostSync().value, 3);
  EXPECT_EQ(figures.MostSync().reached, at(50));
  // Later steps and records leave it there, until a join starts a round.
  figures.OnRecord(0, Step(0.01), at(60));
  figures.OnRecord(0, collective, at(70));
  EXPECT_EQ(figures.MostSync().value, 3);
  figures.OnRecord(0, join, at(80));
  EXPECT_EQ(figures.MostSync().value, 1) << "rank 1's, still in the sync";
}

TEST(RankFiguresTest, AnExitedRankStaysExited) {
  RankFigures figures(1, absl::UnixEpoch());
  figures.SetExited(0);
  figures.SetPhase(0, common::Phase::kStep);
  EXPECT_EQ(figures.Summary(absl::UnixEpoch())[0].phase(), "exited");
}

}  // namespace
}  // namespace ddprun::launcher
