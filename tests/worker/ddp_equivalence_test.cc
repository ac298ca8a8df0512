// Data parallelism must not change the mathematics: after N steps, 2 ranks
// with batch 32 hold the parameters one process holds with batch 64 over
// the same samples. Real processes, real Gloo, real MNIST.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/worker_test_util.h"
#include "worker/checkpoint.h"
#include "worker/mnist_model.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::MnistDir;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::Subprocess;
using ::ddprun::testing::SubprocessOptions;
using ::ddprun::testing::TempDir;

constexpr int kSteps = 12;

class DdpEquivalenceTest : public ::testing::Test {
 protected:
  std::vector<std::string> Argv(const std::string& save, int batch,
                                const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {
        BinaryPath("worker/ddprun-mnist"), "--data-dir", MnistDir(),
        "--epochs", "1", "--max-steps", std::to_string(kSteps),
        "--train-limit", "1024", "--test-limit", "100", "--seed", "7",
        "--lr", "0.05", "--batch-size", std::to_string(batch),
        "--backend", "gloo", "--save", save};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Trains in one process with batch 64; returns the saved parameters.
  std::map<std::string, at::Tensor> TrainAlone(
      const std::vector<std::string>& extra) {
    std::string save = dir_.File("alone.pt");
    auto result = ::ddprun::testing::RunCommand(Argv(save, 64, extra),
                                                absl::Seconds(120));
    EXPECT_TRUE(result.exit.ok()) << result.exit.ToString() << "\n" << result.err;
    auto tensors = LoadStateDict(save);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    return tensors.ok() ? *tensors : std::map<std::string, at::Tensor>{};
  }

  // Trains as 2 ranks with batch 32 through a real server.
  std::map<std::string, at::Tensor> TrainTwoRanks(
      const std::vector<std::string>& extra, const std::string& run_id) {
    auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return {};
    std::string save = dir_.File(run_id + ".pt");
    std::vector<Subprocess> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      SubprocessOptions options;
      options.argv = Argv(save, 32, extra);
      options.env = testing::WorkerEnvFor(rank, 2, (*server)->endpoint(), run_id);
      options.stderr_path = dir_.File(absl::StrCat(run_id, ".err", rank));
      auto child = Subprocess::Start(options);
      EXPECT_TRUE(child.ok()) << child.status();
      if (!child.ok()) return {};
      ranks.push_back(std::move(*child));
    }
    for (int rank = 0; rank < 2; ++rank) {
      auto exit = ranks[rank].Wait(absl::Seconds(120));
      EXPECT_TRUE(exit.has_value() && exit->ok())
          << "rank " << rank << ": "
          << (exit ? exit->ToString() : std::string("still running")) << "\n"
          << ReadFileOrEmpty(dir_.File(absl::StrCat(run_id, ".err", rank)));
    }
    auto tensors = LoadStateDict(save);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    return tensors.ok() ? *tensors : std::map<std::string, at::Tensor>{};
  }

  void ExpectSame(const std::map<std::string, at::Tensor>& a,
                  const std::map<std::string, at::Tensor>& b) {
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      double diff = (tensor - b.at(name)).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5) << name << " differs by " << diff;
    }
  }

  TempDir dir_;
};

TEST_F(DdpEquivalenceTest, TwoRanksFlatAllreduceMatchOneProcess) {
  // One bucket, reduced after backward: the plain flat allreduce.
  std::vector<std::string> flat = {"--no-overlap", "--bucket-mb", "1000"};
  auto alone = TrainAlone(flat);
  auto two = TrainTwoRanks(flat, "flat");
  ExpectSame(alone, two);
  // Training moved the parameters (a test that cannot fail proves nothing).
  torch::manual_seed(7);
  auto initial = StateDict(*MakeMnistMlp());
  ASSERT_TRUE(alone.count("1.weight"));
  EXPECT_GT((initial["1.weight"] - alone["1.weight"]).abs().max().item<double>(),
            1e-3);
}

TEST_F(DdpEquivalenceTest, TwoRanksBucketsFromHooksMatchOneProcess) {
  // 0.05 MB buckets: the 784x128 weight alone, the rest in others; launched
  // from autograd hooks during backward.
  std::vector<std::string> hooks = {"--overlap", "--bucket-mb", "0.05"};
  ExpectSame(TrainAlone(hooks), TrainTwoRanks(hooks, "hooks"));
}

}  // namespace
}  // namespace ddprun::worker
