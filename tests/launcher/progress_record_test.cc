// The progress pipe's wire format: what workers write is what the agent
// reads, and records of older workers still parse.
#include "common/progress_record.h"

#include <gtest/gtest.h>

namespace ddprun::common {
namespace {

using Kind = ProgressRecord::Kind;

TEST(ProgressRecordTest, StepLineWithComputeTimeRoundTrips) {
  const std::string line = StepLine(0.0125);
  EXPECT_EQ(line, "step compute=0.012500\n");
  ProgressRecord record = ParseProgressRecord(line);
  EXPECT_EQ(record.kind, Kind::kStep);
  ASSERT_TRUE(record.compute_seconds.has_value());
  EXPECT_DOUBLE_EQ(*record.compute_seconds, 0.0125);
}

TEST(ProgressRecordTest, OlderStepRecordsParseWithoutAFigure) {
  for (const char* line : {"step", "step\n", "step 12 epoch 1"}) {
    ProgressRecord record = ParseProgressRecord(line);
    EXPECT_EQ(record.kind, Kind::kStep) << line;
    EXPECT_FALSE(record.compute_seconds.has_value()) << line;
  }
  EXPECT_EQ(ParseProgressRecord(kStepLine).kind, Kind::kStep);
}

TEST(ProgressRecordTest, ComputeWordMayFollowOtherWords) {
  ProgressRecord record = ParseProgressRecord("step 7 epoch 0 compute=1.5");
  ASSERT_TRUE(record.compute_seconds.has_value());
  EXPECT_DOUBLE_EQ(*record.compute_seconds, 1.5);
}

TEST(ProgressRecordTest, MalformedOrNegativeFiguresAreDropped) {
  for (const char* line : {"step compute=", "step compute=abc",
                           "step compute=-1", "step compute=nan"}) {
    ProgressRecord record = ParseProgressRecord(line);
    EXPECT_EQ(record.kind, Kind::kStep) << line;
    EXPECT_FALSE(record.compute_seconds.has_value()) << line;
  }
}

TEST(ProgressRecordTest, NoFigureWritesThePlainStepLine) {
  EXPECT_EQ(StepLine(-1), kStepLine);
}

TEST(ProgressRecordTest, PhaseLinesRoundTrip) {
  for (Phase phase : {Phase::kJoin, Phase::kSync, Phase::kCheckpoint,
                      Phase::kStop, Phase::kEval}) {
    ProgressRecord record = ParseProgressRecord(PhaseLine(phase));
    EXPECT_EQ(record.kind, Kind::kPhase);
    EXPECT_EQ(record.phase, phase);
  }
  EXPECT_EQ(ParseProgressRecord(PhaseLine(Phase::kStep)).phase,
            Phase::kFirstStep);
}

}  // namespace
}  // namespace ddprun::common
