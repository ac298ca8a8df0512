// A failing worker leaves torchrun's error-file JSON for its agent.
#include "worker/error_file.h"

#include <gtest/gtest.h>

#include <csignal>

#include "absl/strings/match.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::RunCommand;
using ::ddprun::testing::TempDir;

// The message as Python's json module reads it from the file.
std::string MessageByPython(const std::string& path) {
  auto result =
      RunCommand({"/usr/bin/python3", "-c",
                  "import json, sys\n"
                  "d = json.load(open(sys.argv[1]))\n"
                  "assert d['message']['extraInfo']['timestamp'].isdigit()\n"
                  "print(d['message']['message'])\n",
                  path},
                 absl::Seconds(60));
  EXPECT_TRUE(result.exit.ok())
      << result.err << "\nfile: " << ReadFileOrEmpty(path);
  return result.out;
}

struct Failure {
  ::ddprun::testing::RunResult run;
  std::string message;
};

Failure RunHelper(const std::string& mode, const TempDir& dir) {
  std::string path = dir.File(mode + ".json");
  Failure f;
  f.run = RunCommand({BinaryPath("tests/worker/error_file_helper"), mode},
                     absl::Seconds(60), {{"TORCHELASTIC_ERROR_FILE", path}});
  f.message = MessageByPython(path);
  return f;
}

TEST(ErrorFileTest, UncaughtExceptionNamesTypeAndWhat) {
  TempDir dir;
  Failure f = RunHelper("throw", dir);
  EXPECT_EQ(f.run.exit.signal, SIGABRT) << f.run.exit.ToString();
  EXPECT_EQ(f.message, "std::runtime_error: the \"model\" exploded\n");
}

TEST(ErrorFileTest, FatalSignalIsNamedAndStillKills) {
  TempDir dir;
  Failure f = RunHelper("segv", dir);
  EXPECT_EQ(f.run.exit.signal, SIGSEGV) << f.run.exit.ToString();
  EXPECT_TRUE(absl::StartsWith(f.message, "Signal SIGSEGV (11)")) << f.message;
}

TEST(ErrorFileTest, ErrorStatusWritesFileAndOneLine) {
  TempDir dir;
  Failure f = RunHelper("status", dir);
  EXPECT_EQ(f.run.exit.exit_code, 1);
  EXPECT_EQ(f.message, "NOT_FOUND: no data here\n");
  EXPECT_EQ(f.run.err, "error_file_helper: error: no data here\n");
}

// After an in-place recovery the worker's own final error goes to the new
// round's error file (the agent reads that attempt's folder), not to the
// one the process started with.
TEST(ErrorFileTest, AfterAnInPlaceRoundTheErrorGoesToTheRoundsFile) {
  TempDir dir;
  const std::string first = dir.File("attempt_0.json");
  const std::string second = dir.File("attempt_1.json");
  auto run = RunCommand(
      {BinaryPath("tests/worker/error_file_helper"), "next-round", second},
      absl::Seconds(60), {{"TORCHELASTIC_ERROR_FILE", first}});
  EXPECT_EQ(run.exit.exit_code, 1) << run.err;
  EXPECT_EQ(ReadFileOrEmpty(first), "");
  EXPECT_EQ(MessageByPython(second), "DATA_LOSS: failed in round 2\n");
}

TEST(ErrorFileTest, SuccessWritesNothing) {
  TempDir dir;
  auto run = RunCommand({BinaryPath("tests/worker/error_file_helper"), "ok"},
                        absl::Seconds(60),
                        {{"TORCHELASTIC_ERROR_FILE", dir.File("ok.json")}});
  EXPECT_TRUE(run.exit.ok());
  EXPECT_EQ(ReadFileOrEmpty(dir.File("ok.json")), "");
}

TEST(ErrorFileTest, JsonEscapesControlCharacters) {
  EXPECT_EQ(
      ErrorFileJson("a\"b\\c\nd\x01", 42),
      "{\"message\": {\"message\": \"a\\\"b\\\\c\\nd\\u0001\", "
      "\"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"42\"}}}\n");
}

}  // namespace
}  // namespace ddprun::worker
