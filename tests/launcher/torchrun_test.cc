// A libddp program under Debian's own torchrun (torch 1.13), world 2: the
// drop-in direction the other way round. torchrun sets
// TORCHELASTIC_USE_AGENT_STORE=False, so global rank 0 must serve the
// TCPStore on MASTER_PORT; a libddp that took "set" for "True" waited for a
// store nobody served. Registered only in builds that have ddprun-mnist.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::testing {
namespace {

TEST(TorchrunTest, ALibddpProgramTrainsAtWorldTwoUnderTorchrun) {
  TempDir dir;
  // torch 1.13's torchrun crashes in its log handling without --redirects
  // and --tee.
  // torchrun_baseline.py: torchrun itself, made to start on a torch
  // without libuv (Debian 13's 2.6) too.
  std::vector<std::string> argv = {
      "/usr/bin/python3", TORCHRUN_BASELINE,
      // Not --standalone: it takes the fixed
      // port 29400, which another torchrun on
      // the machine may hold.
      "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id",
      "libddp-under-torchrun", "--nnodes", "1", "--nproc_per_node", "2",
      "--redirects", "1", "--tee", "1", "--log_dir", dir.File("logs"),
      "--no_python", DDPRUN_MNIST_BINARY, "--epochs", "1", "--data-dir",
      MnistDir(), "--train-limit", "2000", "--test-limit", "500", "--max-steps",
      "5", "--save", "", "--summary-json", dir.File("summary.json")};
  RunResult run = RunCommand(argv, absl::Minutes(3));
  ASSERT_FALSE(run.timed_out) << "torchrun did not finish:\n" << run.err;
  ASSERT_TRUE(run.exit.ok()) << run.exit.ToString() << "\n" << run.err;
  std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ASSERT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json\n"
                                << run.err;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), 2) << summary;
  EXPECT_EQ(SummaryNumber(summary, "steps"), 5) << summary;
}

}  // namespace
}  // namespace ddprun::testing
