// The sampler gives the indices torch.utils.data.DistributedSampler gives
// (checked against Debian's python3-torch), and partitions each epoch.
#include "worker/distributed_sampler.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/testing/ci.h"
#include "tests/testing/subprocess.h"

namespace ddprun::worker {
namespace {

DistributedSampler Make(int64_t n, int rank, int world, uint64_t seed,
                        bool shuffle = true) {
  DistributedSamplerOptions options;
  options.dataset_size = n;
  options.rank = rank;
  options.world_size = world;
  options.seed = seed;
  options.shuffle = shuffle;
  return DistributedSampler(options);
}

TEST(DistributedSamplerTest, RanksPartitionTheEpochWithPadding) {
  const int64_t n = 103;
  const int world = 4;
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    DistributedSampler sampler = Make(n, rank, world, 3);
    sampler.SetEpoch(2);
    EXPECT_EQ(sampler.num_samples(), 26);
    ASSERT_EQ(sampler.indices().size(), 26u);
    seen.insert(sampler.indices().begin(), sampler.indices().end());
  }
  // 104 = 103 + one padded repeat; every index appears.
  EXPECT_EQ(seen.size(), 104u);
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST(DistributedSamplerTest, EpochChangesTheOrderSeedKeepsIt) {
  DistributedSampler a = Make(1000, 0, 2, 5);
  DistributedSampler b = Make(1000, 0, 2, 5);
  a.SetEpoch(1);
  b.SetEpoch(1);
  EXPECT_EQ(a.indices(), b.indices());
  b.SetEpoch(2);
  EXPECT_NE(a.indices(), b.indices());
}

TEST(DistributedSamplerTest, NoShuffleIsStridedAndPadsFromTheHead) {
  DistributedSampler s = Make(10, 1, 3, 0, /*shuffle=*/false);
  // 10 samples pad to 12 with 0 and 1; rank 1 takes 1, 4, 7, 10→0.
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7, 0}));
}

TEST(DistributedSamplerTest, ResumeWithSameWorldContinuesAtTheNextSample) {
  // 3 ranks trained 5 steps of 4: 60 samples of the epoch's order. (201
  // divides by 3: a resumed epoch leaves padding out, the whole one not.)
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler whole = Make(201, rank, 3, 8);
    DistributedSampler resumed = Make(201, rank, 3, 8);
    whole.SetEpoch(2);
    resumed.SetEpoch(2, /*consumed=*/60);
    std::vector<int64_t> rest(whole.indices().begin() + 20,
                              whole.indices().end());
    EXPECT_EQ(resumed.indices(), rest) << "rank " << rank;
  }
}

TEST(DistributedSamplerTest, ResumeWithOtherWorldLosesAndRepeatsNothing) {
  // Written by 2 ranks after 48 samples; resumed by 3 (growth in place).
  const int64_t n = 100;
  DistributedSampler old0 = Make(n, 0, 2, 4);
  DistributedSampler old1 = Make(n, 1, 2, 4);
  old0.SetEpoch(1);
  old1.SetEpoch(1);
  EXPECT_EQ(old0.position(24), 48);
  std::multiset<int64_t> seen(old0.indices().begin(),
                              old0.indices().begin() + 24);
  seen.insert(old1.indices().begin(), old1.indices().begin() + 24);
  std::multiset<int64_t> rest;
  std::vector<size_t> counts;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler now = Make(n, rank, 3, 4);
    now.SetEpoch(1, /*consumed=*/48);
    counts.push_back(now.indices().size());
    EXPECT_EQ(now.max_indices(), 18);
    // All of the rest, once: 52 samples.
    EXPECT_EQ(now.samples_between(0, now.max_indices()), 52);
    EXPECT_EQ(now.position(now.max_indices()), n);
    rest.insert(now.indices().begin(), now.indices().end());
  }
  // 52 left, not padded: 18, 17, 17.
  EXPECT_EQ(counts, (std::vector<size_t>{18, 17, 17}));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(seen.count(i) + rest.count(i), 1u) << "sample " << i;
  }
}

TEST(DistributedSamplerTest, ResumedEpochIsSplitInStepsEveryRankTakes) {
  // 2 ranks trained 3 steps of 5 (30 positions) of 61; 3 ranks take the
  // 31 left: 11, 10, 10. Step by step (5 per rank), every rank's first k
  // steps leave the epoch at one position, the same on every rank.
  const int64_t n = 61;
  int64_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler s = Make(n, rank, 3, 9);
    s.SetEpoch(0, 30);
    EXPECT_EQ(s.indices().size(), rank == 0 ? 11u : 10u);
    EXPECT_EQ(s.max_indices(), 11);
    EXPECT_EQ(s.position(5), 45);
    EXPECT_EQ(s.position(10), 60);
    EXPECT_EQ(s.position(15), 61);  // rank 0's third step: one sample
    EXPECT_EQ(s.samples_between(10, 15), 1);
    EXPECT_EQ(s.samples_between(0, 5) + s.samples_between(5, 10) +
                  s.samples_between(10, 15),
              31);
    total += static_cast<int64_t>(s.indices().size());
  }
  EXPECT_EQ(total, 31);
}

TEST(DistributedSamplerTest, PaddingIsNotCountedAsSamples) {
  // 10 samples over 4 ranks: 3 each, 2 of the 12 are padding.
  DistributedSampler s = Make(10, 1, 4, 0);
  s.SetEpoch(0);
  EXPECT_EQ(s.indices().size(), 3u);
  EXPECT_EQ(s.position(2), 8);
  EXPECT_EQ(s.samples_between(0, 2), 8);
  EXPECT_EQ(s.samples_between(2, 3), 2);
  // Resumed at the padded end (every sample trained): nothing is left.
  s.SetEpoch(0, 12);
  EXPECT_TRUE(s.indices().empty());
  EXPECT_EQ(s.max_indices(), 0);
  EXPECT_EQ(s.samples_between(0, 0), 0);
}

TEST(DistributedSamplerTest, FewerSamplesLeftThanRanks) {
  // 2 left for 3 ranks: rank 2 has none but still takes part in the step.
  DistributedSampler s = Make(20, 2, 3, 1);
  s.SetEpoch(0, 18);
  EXPECT_TRUE(s.indices().empty());
  EXPECT_EQ(s.max_indices(), 1);
  EXPECT_EQ(s.samples_between(0, 1), 2);
}

TEST(DistributedSamplerTest, SameIndicesAsPythonTorch) {
  const char* script =
      "import sys, torch\n"
      "from torch.utils.data import DistributedSampler\n"
      "s = DistributedSampler(range(1001), num_replicas=3, rank=2, "
      "shuffle=True, seed=11)\n"
      "s.set_epoch(4)\n"
      "print(' '.join(str(i) for i in s))\n";
  auto result = ::ddprun::testing::RunCommand(
      {"/usr/bin/python3", "-c", script}, absl::Seconds(120));
  if (result.exit.exit_code != 0 &&
      result.err.find("No module named 'torch'") != std::string::npos) {
    DDPRUN_SKIP_UNLESS_CI(
        "python3-torch is not installed (scripts/setup.sh installs it)");
  }
  ASSERT_TRUE(result.exit.ok()) << result.err;
  std::vector<int64_t> python;
  for (absl::string_view field :
       absl::StrSplit(result.out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    int64_t i = 0;
    ASSERT_TRUE(absl::SimpleAtoi(field, &i)) << field;
    python.push_back(i);
  }
  DistributedSampler ours = Make(1001, 2, 3, 11);
  ours.SetEpoch(4);
  EXPECT_EQ(ours.indices(), python);
}

}  // namespace
}  // namespace ddprun::worker
