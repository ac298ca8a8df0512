// Two real processes build ProcessGroupGloo through the gRPC store of a real
// rendezvous server and run an allreduce and a broadcast.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/worker_test_util.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::Subprocess;
using ::ddprun::testing::SubprocessOptions;
using ::ddprun::testing::TempDir;

TEST(GlooThroughGrpcStoreTest, TwoProcessesAllreduceAndBroadcast) {
  auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  std::vector<Subprocess> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    SubprocessOptions options;
    options.argv = {::ddprun::testing::BinaryPath("tests/worker/pg_helper")};
    options.env =
        testing::WorkerEnvFor(rank, 2, (*server)->endpoint(), "gloo-test");
    options.stdout_path = dir.File(absl::StrCat("out", rank));
    options.stderr_path = dir.File(absl::StrCat("err", rank));
    auto child = Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    ranks.push_back(std::move(*child));
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto exit = ranks[rank].Wait(absl::Seconds(60));
    ASSERT_TRUE(exit.has_value()) << "rank " << rank << " did not finish";
    EXPECT_TRUE(exit->ok())
        << "rank " << rank << ": " << exit->ToString() << "\n"
        << ::ddprun::testing::ReadFileOrEmpty(
               dir.File(absl::StrCat("err", rank)));
    EXPECT_NE(
        ::ddprun::testing::ReadFileOrEmpty(dir.File(absl::StrCat("out", rank)))
            .find(absl::StrCat("rank ", rank, " ok")),
        std::string::npos);
  }
}

// What tests/gpu/run.sh's first step does on one GPU, with Gloo: a world of
// one given a store endpoint builds its group on the rendezvous's gRPC store
// (not an in-process HashStore), and its collectives write keys there.
TEST(GlooThroughGrpcStoreTest, AWorldOfOneUsesTheGrpcStore) {
  auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  SubprocessOptions options;
  options.argv = {::ddprun::testing::BinaryPath("tests/worker/pg_helper")};
  options.env = testing::WorkerEnvFor(0, 1, (*server)->endpoint(), "one");
  options.env["PG_HELPER_EXPECT_STORE"] = "1";
  options.stdout_path = dir.File("out");
  options.stderr_path = dir.File("err");
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  auto exit = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value()) << "a world of one did not finish";
  EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n"
                          << ::ddprun::testing::ReadFileOrEmpty(
                                 dir.File("err"));
  EXPECT_NE(
      ::ddprun::testing::ReadFileOrEmpty(dir.File("out")).find("rank 0 ok"),
      std::string::npos);
}

TEST(GlooThroughGrpcStoreTest, LonePeerFailsWithClearErrorInsteadOfHanging) {
  auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  SubprocessOptions options;
  options.argv = {::ddprun::testing::BinaryPath("tests/worker/pg_helper")};
  options.env = testing::WorkerEnvFor(0, 2, (*server)->endpoint(), "alone");
  options.env["PG_HELPER_TIMEOUT_MS"] = "1000";
  options.stderr_path = dir.File("err");
  auto child = Subprocess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  auto exit = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value()) << "a rank whose peer never came hung";
  EXPECT_FALSE(exit->ok());
  // The first exchange that waits for the missing peer names it: the
  // gradient path's node layouts (libddp's default) or Gloo's own.
  std::string err = ::ddprun::testing::ReadFileOrEmpty(dir.File("err"));
  EXPECT_TRUE(err.find("never set") != std::string::npos ||
              err.find("Gloo") != std::string::npos)
      << err;
}

}  // namespace
}  // namespace ddprun::worker
