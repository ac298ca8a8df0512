// The node cache (what a node's workers build once through DDPRUN_SHM_DIR),
// and MNIST loaded through it.
#include "worker/node_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "mnist/mnist_data.h"
#include "tests/testing/ci.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::MnistDir;
using ::ddprun::testing::TempDir;

// Fills `size` bytes with a pattern and counts the builds.
struct Builder {
  std::atomic<int> builds{0};
  absl::Status operator()(void* out, size_t size) {
    ++builds;
    auto* bytes = static_cast<unsigned char*>(out);
    for (size_t i = 0; i < size; ++i)
      bytes[i] = static_cast<unsigned char>(i * 7);
    return absl::OkStatus();
  }
};

bool HasPattern(const MappedBytes& m) {
  const auto* bytes = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < m.size(); ++i) {
    if (bytes[i] != static_cast<unsigned char>(i * 7)) return false;
  }
  return true;
}

TEST(NodeCacheTest, TheFirstCallerBuildsAndTheNextOnesMap) {
  TempDir dir;
  Builder builder;
  constexpr size_t kSize = 1 << 20;
  auto build = [&](void* out) { return builder(out, kSize); };
  auto first = MapOrBuild(dir.path(), "entry", kSize, build);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MapOrBuild(dir.path(), "entry", kSize, build);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(builder.builds, 1);
  EXPECT_TRUE(HasPattern(**first));
  EXPECT_TRUE(HasPattern(**second));
  EXPECT_EQ(std::filesystem::file_size(dir.File("entry")), kSize);
  EXPECT_FALSE(std::filesystem::exists(dir.File("entry.building")));
}

TEST(NodeCacheTest, ConcurrentCallersWaitForOneBuild) {
  TempDir dir;
  Builder builder;
  constexpr size_t kSize = 4 << 20;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto got = MapOrBuild(dir.path(), "entry", kSize,
                            [&](void* out) { return builder(out, kSize); });
      if (got.ok() && HasPattern(**got)) ++good;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good, 4);
  EXPECT_EQ(builder.builds, 1);
}

TEST(NodeCacheTest, AFailedBuildPublishesNothingAndReturnsItsError) {
  TempDir dir;
  auto failed = MapOrBuild(dir.path(), "entry", 4096, [](void*) {
    return absl::DataLossError("the source is corrupt");
  });
  EXPECT_EQ(failed.status(), absl::DataLossError("the source is corrupt"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("entry")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("entry.building")));
  Builder builder;
  auto retried = MapOrBuild(dir.path(), "entry", 4096,
                            [&](void* out) { return builder(out, 4096); });
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(builder.builds, 1);
}

TEST(NodeCacheTest, AnEntryOfTheWrongSizeIsRebuilt) {
  TempDir dir;
  std::ofstream(dir.File("entry")) << "short";
  Builder builder;
  auto got = MapOrBuild(dir.path(), "entry", 8192,
                        [&](void* out) { return builder(out, 8192); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(builder.builds, 1);
  EXPECT_TRUE(HasPattern(**got));
}

TEST(NodeCacheTest, AMissingFolderIsUnavailable) {
  Builder builder;
  auto got = MapOrBuild("/nonexistent/ddprun", "entry", 4096,
                        [&](void* out) { return builder(out, 4096); });
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_EQ(builder.builds, 0);
}

// A full tmpfs must be an error before anything is written, not a SIGBUS
// when a page of the mapping cannot be backed. Needs root (mount).
TEST(NodeCacheTest, AFullTmpfsIsUnavailableNotACrash) {
  TempDir dir;
  if (mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=256k") != 0) {
    DDPRUN_SKIP_UNLESS_CI(std::string("cannot mount a tmpfs here (") +
                          std::strerror(errno) + "); needs root");
  }
  absl::Cleanup unmount = [&] { umount(dir.path().c_str()); };
  Builder builder;
  auto got = MapOrBuild(dir.path(), "entry", 1 << 20,
                        [&](void* out) { return builder(out, 1 << 20); });
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("reserve"), std::string::npos)
      << got.status();
  EXPECT_EQ(builder.builds, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.File("entry.building")));
}

MnistOptions Mnist(const std::string& cache_dir) {
  MnistOptions options;
  options.data_dir = MnistDir();
  options.train_limit = 5000;
  options.cache_dir = cache_dir;
  return options;
}

TEST(NodeCacheTest, MnistThroughTheCacheIsBitForBitTheSame) {
  TempDir dir;
  auto privately = LoadMnist(Mnist(""));
  ASSERT_TRUE(privately.ok()) << privately.status();
  auto built = LoadMnist(Mnist(dir.path()));
  ASSERT_TRUE(built.ok()) << built.status();
  auto mapped = LoadMnist(Mnist(dir.path()));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  for (const MnistData* d : {&*built, &*mapped}) {
    EXPECT_TRUE(at::equal(d->train.images, privately->train.images));
    EXPECT_TRUE(at::equal(d->train.labels, privately->train.labels));
    EXPECT_TRUE(at::equal(d->test.images, privately->test.images));
    EXPECT_EQ(d->train.size(), 5000);
  }
  // One entry per split, each the size of its float images.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".f32") continue;
    ++entries;
    const bool train =
        e.path().filename().string().find("-train-") != std::string::npos;
    EXPECT_EQ(e.file_size(), (train ? 5000 : 10000) * 784 * sizeof(float))
        << e.path();
  }
  EXPECT_EQ(entries, 2);
}

}  // namespace
}  // namespace ddprun::worker
