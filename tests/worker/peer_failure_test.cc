// When a peer dies mid-training, the surviving rank fails fast with one clear
// error line and an error file for its agent, instead of hanging or
// aborting.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/progress_record.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"
#include "tests/worker/worker_test_util.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::ReadFileOrEmpty;

class PeerFailureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PeerFailureTest, SurvivorExitsWithClearErrorAndErrorFile) {
  auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  ::ddprun::testing::TempDir dir;
  int progress[2];
  ASSERT_EQ(pipe(progress), 0);
  fcntl(progress[0], F_SETFL, O_NONBLOCK);
  std::vector<::ddprun::testing::Subprocess> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ::ddprun::testing::SubprocessOptions options;
    options.argv = {::ddprun::testing::BinaryPath("mnist/ddprun-mnist"),
                    "--data-dir",
                    ::ddprun::testing::MnistDir(),
                    "--epochs",
                    "1000",
                    "--train-limit",
                    "6400",
                    "--test-limit",
                    "100",
                    "--save",
                    "",
                    "--no-progress",
                    "--gradient-sync",
                    GetParam()};
    options.env = testing::WorkerEnvFor(rank, 2, (*server)->endpoint(), "peer");
    // One node's folder, as ddprun gives it: the shared-memory path's.
    options.env["DDPRUN_SHM_DIR"] = dir.path();
    options.env["TORCHELASTIC_ERROR_FILE"] =
        dir.File(absl::StrCat("error", rank));
    if (rank == 1)
      options.env["DDPRUN_PROGRESS_FD"] = std::to_string(progress[1]);
    options.stderr_path = dir.File(absl::StrCat("err", rank));
    auto child = ::ddprun::testing::Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    ranks.push_back(std::move(*child));
  }
  close(progress[1]);
  // Kill rank 1 once it has trained a few steps.
  std::string records;
  ASSERT_TRUE(::ddprun::testing::WaitFor(
      [&] {
        char buffer[256];
        ssize_t n = read(progress[0], buffer, sizeof(buffer));
        if (n > 0) records.append(buffer, n);
        // libddp's records of completed steps (common/progress_record.h:
        // "step" or "step compute=...").
        size_t steps = 0;
        for (absl::string_view line :
             absl::StrSplit(records, '\n', absl::SkipEmpty())) {
          steps += common::ParseProgressRecord(line).kind ==
                   common::ProgressRecord::Kind::kStep;
        }
        return steps >= 5;
      },
      absl::Seconds(60)))
      << ReadFileOrEmpty(dir.File("err1"));
  close(progress[0]);
  ranks[1].Signal(SIGKILL);
  auto exit = ranks[0].Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value()) << "the survivor hung";
  EXPECT_EQ(exit->exit_code, 1) << exit->ToString();
  std::string err = ReadFileOrEmpty(dir.File("err0"));
  EXPECT_TRUE(absl::StrContains(err, "ddprun-mnist: error: ")) << err;
  // The gradient path of this case ran.
  EXPECT_TRUE(absl::StrContains(err, std::string(GetParam()) == "auto"
                                         ? "through shared-memory"
                                         : "through process-group"))
      << err;
  std::string error_file = ReadFileOrEmpty(dir.File("error0"));
  EXPECT_TRUE(
      absl::StrContains(error_file, "\"message\": {\"message\": \"INTERNAL: "))
      << error_file;
}

INSTANTIATE_TEST_SUITE_P(BothGradientPaths, PeerFailureTest,
                         ::testing::Values("auto", "process-group"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "auto"
                                      ? "SharedMemoryAllreduce"
                                      : "ProcessGroupGloo";
                         });

}  // namespace
}  // namespace ddprun::worker
