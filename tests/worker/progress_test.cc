// The per-step records on DDPRUN_PROGRESS_FD and rank 0's progress view.
#include "worker/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/progress_record.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::MnistDir;

TEST(ProgressTest, LineShowsEpochStepLossSpeedAndEta) {
  StepProgress p;
  p.epoch = 1;
  p.epochs = 3;
  p.step_in_epoch = 100;
  p.steps_per_epoch = 200;
  p.loss = 0.25;
  p.samples_per_sec = 6400;
  p.samples_per_step = 64;
  // 100 + 200 steps left at 100 steps/s.
  EXPECT_EQ(ProgressReporter::Line(p),
            "epoch 2/3 step 100/200 loss 0.2500 6400 samples/s ETA 3s");
}

TEST(ProgressTest, WorkerWritesOneRecordPerStepToTheAgentsPipe) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ::ddprun::testing::TempDir dir;
  ::ddprun::testing::SubprocessOptions options;
  options.argv = {BinaryPath("mnist/ddprun-mnist"),
                  "--data-dir",
                  MnistDir(),
                  "--epochs",
                  "1",
                  "--max-steps",
                  "25",
                  "--train-limit",
                  "3200",
                  "--test-limit",
                  "100",
                  "--save",
                  ""};
  options.env = {{"DDPRUN_PROGRESS_FD", std::to_string(fds[1])}};
  options.stderr_path = dir.File("err");
  auto child = ::ddprun::testing::Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  close(fds[1]);
  auto exit = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value() && exit->ok())
      << ::ddprun::testing::ReadFileOrEmpty(dir.File("err"));
  std::string records;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0)
    records.append(buffer, n);
  close(fds[0]);
  // One record a step (libddp's DataParallel), between the phases it and
  // the program report (common/progress_record.h).
  std::vector<std::string> lines =
      absl::StrSplit(records, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty()) << records;
  auto is_step = [](const std::string& line) {
    return common::ParseProgressRecord(line).kind ==
           common::ProgressRecord::Kind::kStep;
  };
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(), is_step), 25) << records;
  auto first_step = std::find_if(lines.begin(), lines.end(), is_step);
  // Every step after the first carries the rank's compute time (the first
  // has no previous sync to count from).
  ASSERT_NE(first_step, lines.end());
  EXPECT_EQ(*first_step, "step") << records;
  int with_figure = 0;
  for (const std::string& line : lines) {
    std::optional<double> compute =
        common::ParseProgressRecord(line).compute_seconds;
    if (compute.has_value()) {
      EXPECT_GT(*compute, 0) << line;
      EXPECT_LT(*compute, 30) << line;
      ++with_figure;
    }
  }
  EXPECT_EQ(with_figure, 24) << records;
  EXPECT_NE(std::find(lines.begin(), first_step, "phase join"), first_step)
      << records;
  EXPECT_NE(std::find(lines.begin(), first_step, "phase step"), first_step)
      << records;
  EXPECT_EQ(lines.back(), "phase stop") << records;
  // Not a terminal: plain lines, the first one at the first step.
  EXPECT_TRUE(
      absl::StrContains(::ddprun::testing::ReadFileOrEmpty(dir.File("err")),
                        "epoch 1/1 step 1/100 loss"));
}

TEST(ProgressTest, ClosedPipeDoesNotKillTheWorker) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);  // nobody reads: writes fail with EPIPE
  auto result = ::ddprun::testing::RunCommand(
      {BinaryPath("mnist/ddprun-mnist"), "--data-dir", MnistDir(), "--epochs",
       "1", "--max-steps", "5", "--train-limit", "640", "--test-limit", "100",
       "--save", ""},
      absl::Seconds(60), {{"DDPRUN_PROGRESS_FD", std::to_string(fds[1])}});
  close(fds[1]);
  EXPECT_TRUE(result.exit.ok()) << result.exit.ToString() << result.err;
}

}  // namespace
}  // namespace ddprun::worker
