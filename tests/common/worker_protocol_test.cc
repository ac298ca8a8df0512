// The agent↔worker protocol (common/worker_protocol.h) round-trips: what
// the agent writes is what the worker reads, for the environment and for
// every progress record, and what is not the protocol is refused clearly.
#include "common/worker_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/testing/subprocess.h"

namespace ddprun::common {
namespace {

using Vars = std::vector<std::pair<std::string, std::string>>;

TEST(WorkerProtocolTest, TheEnvironmentRoundTrips) {
  const std::vector<std::string> env = {
      "RANK=3",
      "EQUALS=a=b=c",
      "EMPTY=",
      "UNICODE=\xc3\xa9t\xc3\xa9 \xe2\x9c\x93",
      "ESCAPES=line\nbreak\ttab \"quoted\" back\\slash \x01",
      "no equals sign",
      "TWICE=first",
      "TWICE=last",
  };
  const std::string json = EncodeWorkerEnv(env);
  EXPECT_EQ(json.find('\n'), std::string::npos)
      << "the control pipe carries one line per round: " << json;
  auto decoded = DecodeWorkerEnv(json);
  ASSERT_TRUE(decoded.ok()) << decoded.status() << "\n" << json;
  EXPECT_EQ(*decoded,
            (Vars{
                {"EMPTY", ""},
                {"EQUALS", "a=b=c"},
                {"ESCAPES", "line\nbreak\ttab \"quoted\" back\\slash \x01"},
                {"RANK", "3"},
                {"TWICE", "last"},
                {"UNICODE", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"},
            }));
  EXPECT_EQ(EncodeWorkerEnv({}), "{}");
  auto none = DecodeWorkerEnv("{}");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(WorkerProtocolTest, AnyWriterOfAnObjectOfStringsIsRead) {
  auto decoded =
      DecodeWorkerEnv(" {\n \"B\" : \"2\",\t\"A\":\"\\u00e9\\n\"}\n");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, (Vars{{"A", "\xc3\xa9\n"}, {"B", "2"}}));
}

TEST(WorkerProtocolTest, WhatIsNotAnObjectOfStringsIsRefusedClearly) {
  for (const std::string bad :
       {"", "[]", "\"RANK\"", "{\"RANK\": 3}", "{\"RANK\": null}",
        "{\"RANK\": \"3\"", "{\"A\": [\"1\"]}"}) {
    SCOPED_TRACE(bad);
    auto decoded = DecodeWorkerEnv(bad);
    ASSERT_FALSE(decoded.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(decoded.status()));
    EXPECT_TRUE(
        absl::StrContains(decoded.status().message(), "DDPRUN_STANDBY_FD"))
        << decoded.status();
    EXPECT_TRUE(absl::StrContains(decoded.status().message(),
                                  "start this program with ddprun"))
        << decoded.status();
  }
}

// ddprun's Python standby shim (launcher/agent/python_standby.h) reads the
// same text with json.loads.
TEST(WorkerProtocolTest, PythonsJsonReadsTheEnvironment) {
  const std::string json = EncodeWorkerEnv(
      {"RANK=3", "UNICODE=\xc3\xa9", "ESCAPES=a\nb\"c\\d", "EQUALS=x=y"});
  auto result =
      ::ddprun::testing::RunCommand({"/usr/bin/python3", "-c",
                                     "import json, sys\n"
                                     "d = json.loads(sys.argv[1])\n"
                                     "print(repr(sorted(d.items())))\n",
                                     json},
                                    absl::Seconds(60));
  ASSERT_TRUE(result.exit.ok()) << result.err;
  EXPECT_EQ(result.out,
            "[('EQUALS', 'x=y'), ('ESCAPES', 'a\\nb\"c\\\\d'), ('RANK', '3'), "
            "('UNICODE', '\xc3\xa9')]\n");
}

TEST(WorkerProtocolTest, EveryProgressRecordRoundTrips) {
  for (int i = 0; i < kNumPhases; ++i) {
    const Phase phase = static_cast<Phase>(i);
    const std::string written = PhaseLine(phase);
    absl::string_view line = written;
    ASSERT_TRUE(absl::ConsumeSuffix(&line, "\n")) << written;
    const ProgressRecord record = ParseProgressRecord(line);
    EXPECT_EQ(record.kind, ProgressRecord::Kind::kPhase) << line;
    // The first step is the agent's notion: a worker writes "phase step"
    // when it starts stepping, which the agent reads as the first step
    // until a step record comes.
    EXPECT_EQ(record.phase, phase == Phase::kStep ? Phase::kFirstStep : phase)
        << line;
    EXPECT_EQ(ParsePhase(PhaseName(phase)), phase);
  }
  absl::string_view step = kStepLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&step, "\n"));
  EXPECT_EQ(ParseProgressRecord(step).kind, ProgressRecord::Kind::kStep);
  absl::string_view in_place = kInPlaceLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&in_place, "\n"));
  EXPECT_EQ(ParseProgressRecord(in_place).kind, ProgressRecord::Kind::kInPlace);
  absl::string_view reports = kReportsBetweenStepsLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&reports, "\n"));
  EXPECT_EQ(ParseProgressRecord(reports).kind,
            ProgressRecord::Kind::kReportsBetweenSteps);
  absl::string_view round_failed = kRoundFailedLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&round_failed, "\n"));
  EXPECT_EQ(ParseProgressRecord(round_failed).kind,
            ProgressRecord::Kind::kRoundFailed);
  absl::string_view collective = kCollectiveLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&collective, "\n"));
  EXPECT_EQ(ParseProgressRecord(collective).kind,
            ProgressRecord::Kind::kCollective);
  absl::string_view done = kCollectiveDoneLine;
  ASSERT_TRUE(absl::ConsumeSuffix(&done, "\n"));
  EXPECT_EQ(ParseProgressRecord(done).kind,
            ProgressRecord::Kind::kCollectiveDone);
  EXPECT_EQ(ParseProgressRecord("something newer").kind,
            ProgressRecord::Kind::kOther);
}

}  // namespace
}  // namespace ddprun::common
