// Data parallelism must not change the mathematics: after N steps, 2 ranks
// with batch 32 hold the parameters one process holds with batch 64 over
// the same samples. Real processes, real Gloo, real MNIST.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "mnist/mnist_model.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/worker_test_util.h"
#include "worker/checkpoint.h"

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
                                const std::vector<std::string>& extra,
                                int steps = kSteps) {
    std::vector<std::string> argv = {BinaryPath("mnist/ddprun-mnist"),
                                     "--data-dir",
                                     MnistDir(),
                                     "--epochs",
                                     "100",
                                     "--max-steps",
                                     std::to_string(steps),
                                     "--train-limit",
                                     "1024",
                                     "--test-limit",
                                     "100",
                                     "--seed",
                                     "7",
                                     "--batch-size",
                                     std::to_string(batch),
                                     "--backend",
                                     "gloo",
                                     "--save",
                                     save};
    if (std::find(extra.begin(), extra.end(), "--lr") == extra.end()) {
      argv.insert(argv.end(), {"--lr", "0.05"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Trains in one process with batch 64; returns the saved parameters.
  std::map<std::string, at::Tensor> TrainAlone(
      const std::vector<std::string>& extra) {
    std::string save = dir_.File("alone.pt");
    auto result = ::ddprun::testing::RunCommand(Argv(save, 64, extra),
                                                absl::Seconds(120));
    EXPECT_TRUE(result.exit.ok()) << result.exit.ToString() << "\n"
                                  << result.err;
    auto tensors = LoadStateDict(save);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    return tensors.ok() ? *tensors : std::map<std::string, at::Tensor>{};
  }

  // Trains as 2 ranks with batch 32 through a real server.
  // With `shm_dir`, the ranks share it as DDPRUN_SHM_DIR (one node under
  // ddprun), which the shared-memory gradient allreduce needs.
  std::map<std::string, at::Tensor> TrainTwoRanks(
      const std::vector<std::string>& extra, const std::string& run_id,
      int steps = kSteps, const std::string& shm_dir = "") {
    auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return {};
    std::string save = dir_.File(run_id + ".pt");
    if (!shm_dir.empty()) std::filesystem::create_directories(shm_dir);
    std::vector<Subprocess> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      SubprocessOptions options;
      options.argv = Argv(save, 32, extra, steps);
      options.env =
          testing::WorkerEnvFor(rank, 2, (*server)->endpoint(), run_id);
      if (!shm_dir.empty()) options.env["DDPRUN_SHM_DIR"] = shm_dir;
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
    ASSERT_EQ(a.size(), 4u);  // both models have two weights and two biases
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      double diff = (tensor - b.at(name)).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5) << name << " differs by " << diff;
    }
  }

  // The same parameters to the bit (a resumed run redoes exactly the
  // uninterrupted run's arithmetic).
  void ExpectIdentical(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b) {
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      const at::Tensor other = b.at(name);
      ASSERT_EQ(tensor.nbytes(), other.nbytes()) << name;
      EXPECT_EQ(
          std::memcmp(tensor.data_ptr(), other.data_ptr(), tensor.nbytes()), 0)
          << name << " differs by "
          << (tensor - other).abs().max().item<double>();
    }
  }

  TempDir dir_;
};

TEST_F(DdpEquivalenceTest, TwoRanksFlatAllreduceMatchOneProcess) {
  // One bucket: the plain flat allreduce, launched by the last hook.
  std::vector<std::string> flat = {"--gradient-sync", "process-group",
                                   "--bucket-mb", "1000"};
  auto alone = TrainAlone(flat);
  auto two = TrainTwoRanks(flat, "flat");
  ExpectSame(alone, two);
  // Training moved the parameters (a test that cannot fail proves nothing).
  torch::manual_seed(7);
  auto initial = StateDict(*MakeMnistMlp());
  ASSERT_TRUE(alone.count("1.weight"));
  EXPECT_GT(
      (initial["1.weight"] - alone["1.weight"]).abs().max().item<double>(),
      1e-3);
}

TEST_F(DdpEquivalenceTest, TwoRanksBucketsFromHooksMatchOneProcess) {
  // 0.05 MB buckets: the 784x128 weight alone, the rest in others; launched
  // from autograd hooks during backward.
  std::vector<std::string> hooks = {"--gradient-sync", "process-group",
                                    "--bucket-mb", "0.05"};
  ExpectSame(TrainAlone(hooks), TrainTwoRanks(hooks, "hooks"));
}

TEST_F(DdpEquivalenceTest, SmallCnnWithBucketsFromHooksMatchesOneProcess) {
  std::vector<std::string> cnn = {"--model",         "cnn",
                                  "--gradient-sync", "process-group",
                                  "--bucket-mb",     "0.01"};
  auto alone = TrainAlone(cnn);
  ExpectSame(alone, TrainTwoRanks(cnn, "cnn"));
  ASSERT_TRUE(alone.count("0.weight"));  // the convolution
}

TEST_F(DdpEquivalenceTest, NoSyncGradientAccumulationMatchesOneProcess) {
  // Two micro-batches per step; the first backward runs under NoSync.
  std::vector<std::string> accumulate = {"--accumulate",    "2",
                                         "--gradient-sync", "process-group",
                                         "--bucket-mb",     "0.05"};
  ExpectSame(TrainAlone(accumulate), TrainTwoRanks(accumulate, "accumulate"));
}

TEST_F(DdpEquivalenceTest, SharedMemoryAllreduceMatchesOneProcess) {
  // The CPU default under ddprun: buckets reduced by GradientAllreduce
  // through shared memory after backward; several buckets and a NoSync
  // micro-batch, MLP and CNN. (Accumulating doubles the step; at lr 0.05 the
  // CNN then amplifies float rounding to ~5e-5 in 12 steps, on every path,
  // so it trains at 0.01.)
  for (const std::string model : {"mlp", "cnn"}) {
    SCOPED_TRACE(model);
    std::vector<std::string> direct = {
        "--model",     model,  "--gradient-sync", "auto",
        "--bucket-mb", "0.01", "--accumulate",    "2",
        "--lr",        "0.01"};
    const std::string run_id = "direct-" + model;
    ExpectSame(TrainAlone(direct), TrainTwoRanks(direct, run_id, kSteps,
                                                 dir_.File(run_id + ".shm")));
    // The path this test is about ran (rank 0 says which).
    EXPECT_TRUE(absl::StrContains(
        ReadFileOrEmpty(dir_.File(absl::StrCat(run_id, ".err0"))),
        " bucket(s) through shared-memory"))
        << ReadFileOrEmpty(dir_.File(absl::StrCat(run_id, ".err0")));
  }
}

TEST_F(DdpEquivalenceTest, IntraOpThreadsFollowOmpNumThreads) {
  // ddprun-mnist pins no thread count: LibTorch's intra-op threads are what
  // OMP_NUM_THREADS says (ddprun sets it only for several workers a node).
  for (const std::string threads : {"1", "3"}) {
    SCOPED_TRACE(threads);
    const std::string summary = dir_.File("threads" + threads + ".json");
    SubprocessOptions options;
    options.argv = Argv(dir_.File("threads.pt"), 64,
                        {"--summary-json", summary}, /*steps=*/2);
    options.env["OMP_NUM_THREADS"] = threads;
    options.stderr_path = summary + ".err";
    auto child = Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    auto exit = child->Wait(absl::Seconds(120));
    ASSERT_TRUE(exit.has_value() && exit->ok())
        << ReadFileOrEmpty(summary + ".err");
    EXPECT_TRUE(absl::StrContains(ReadFileOrEmpty(summary),
                                  "\"intra_op_threads\": " + threads + ","))
        << ReadFileOrEmpty(summary);
  }
}

TEST_F(DdpEquivalenceTest, ResumeContinuesAtTheExactSample) {
  // 1024 samples / (2 ranks x 32) = 16 steps per epoch; 40 steps cross two
  // epoch ends. The interrupted run stops at step 29 with its newest
  // checkpoint at step 25, mid-epoch; the resumed run continues from there.
  const std::vector<std::string> checkpoints = {
      "--checkpoint-dir", dir_.File("ckpt"), "--checkpoint-every", "5"};
  auto uninterrupted = TrainTwoRanks({}, "whole", 40);
  TrainTwoRanks(checkpoints, "interrupted", 29);
  ASSERT_TRUE(std::ifstream(dir_.File("ckpt/ckpt-0000000025.pt")).good());
  ASSERT_FALSE(std::ifstream(dir_.File("ckpt/ckpt-0000000029.pt")).good());
  std::vector<std::string> resume = checkpoints;
  resume.insert(resume.end(), {"--summary-json", dir_.File("resumed.json")});
  auto resumed = TrainTwoRanks(resume, "resumed", 40);
  EXPECT_TRUE(absl::StrContains(ReadFileOrEmpty(dir_.File("resumed.json")),
                                "\"resumed_from_step\": 25"))
      << ReadFileOrEmpty(dir_.File("resumed.json"));
  ExpectIdentical(uninterrupted, resumed);
}

}  // namespace
}  // namespace ddprun::worker
