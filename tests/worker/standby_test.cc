// AwaitActivation (ddprun --prewarm for libddp programs) in a real process:
// the descriptor named by DDPRUN_STANDBY_FD is a file opened by the shell,
// which reads as the agent's pipe does (the data, then end of input).
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/worker_env.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs standby_helper with descriptor 3 reading `input`.
RunResult RunStandby(const TempDir& dir, const std::string& input) {
  std::ofstream(dir.File("input")) << input;
  return RunCommand(
      {"/bin/sh", "-c", "exec \"$0\" 3<\"$1\"",
       BinaryPath("tests/worker/standby_helper"), dir.File("input")},
      absl::Seconds(60),
      {{"DDPRUN_STANDBY_FD", "3"}, {"BEFORE_ACTIVATION", "1"}});
}

TEST(StandbyTest, TheRoundsEnvironmentReplacesTheWholeEnvironment) {
  TempDir dir;
  RunResult r = RunStandby(
      dir, R"({"RANK":"1","WORLD_SIZE":"2","Q":"a \"b\" c\\d","NL":"x\ny",)"
           R"("U":"\u00e9\u0001","EMPTY":""})");
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_EQ(r.out,
            "EMPTY=\n"
            "NL=x\ny\n"
            "Q=a \"b\" c\\d\n"
            "RANK=1\n"
            "U=\xc3\xa9\x01\n"
            "WORLD_SIZE=2\n"
            "activated\n");
  EXPECT_THAT(r.err, HasSubstr("activated as rank 1"));
}

TEST(StandbyTest, EndOfInputWithoutDataExitsZeroQuietly) {
  TempDir dir;
  RunResult r = RunStandby(dir, "");
  EXPECT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_EQ(r.out, "");  // it never got past AwaitActivation
  EXPECT_EQ(r.err, "");
}

TEST(StandbyTest, MalformedDataIsAnErrorNamingTheDescriptor) {
  TempDir dir;
  RunResult r = RunStandby(dir, R"({"RANK": 1})");
  EXPECT_EQ(r.exit.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("DDPRUN_STANDBY_FD"));
  EXPECT_EQ(r.out, "");
}

TEST(StandbyTest, WithoutTheDescriptorItReturnsAtOnce) {
  RunResult r = RunCommand({BinaryPath("tests/worker/standby_helper")},
                           absl::Seconds(60), {{"BEFORE_ACTIVATION", "1"}});
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_THAT(r.out, HasSubstr("BEFORE_ACTIVATION=1\n"));
  EXPECT_THAT(r.out, HasSubstr("activated\n"));
  EXPECT_THAT(r.err, Not(HasSubstr("prewarmed")));
}

TEST(StandbyTest, TheWorkerEnvironmentIsRefusedBeforeActivation) {
  auto env = worker::ReadWorkerEnvFrom(
      [](const char* name) -> std::optional<std::string> {
        if (std::string(name) == "DDPRUN_STANDBY_FD") return "5";
        return std::nullopt;
      });
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("AwaitActivation"));
}

}  // namespace
}  // namespace ddprun::testing
