// SyncFromSurvivor over a real Gloo group of two processes (the rendezvous's
// gRPC store): the newest state reaches every rank; and when the rank
// sending it dies in the middle (after its record, before the tensors),
// the receiver's sync fails and its own state is left whole (all or
// nothing), so that it can offer it in the next round.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/worker_test_util.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::Subprocess;
using ::ddprun::testing::SubprocessOptions;
using ::ddprun::testing::TempDir;

struct Outcome {
  std::string out[2];
  std::optional<::ddprun::testing::ExitInfo> exit[2];
};

Outcome RunSync(bool source_dies) {
  auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
  EXPECT_TRUE(server.ok()) << server.status();
  TempDir dir;
  std::vector<Subprocess> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    SubprocessOptions options;
    options.argv = {::ddprun::testing::BinaryPath("tests/worker/sync_helper")};
    options.env =
        testing::WorkerEnvFor(rank, 2, (*server)->endpoint(), "sync-test");
    if (source_dies) options.env["SYNC_HELPER_SOURCE_DIES"] = "1";
    options.stdout_path = dir.File(absl::StrCat("out", rank));
    options.stderr_path = dir.File(absl::StrCat("err", rank));
    auto child = Subprocess::Start(options);
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return {};
    ranks.push_back(std::move(*child));
  }
  Outcome outcome;
  for (int rank = 0; rank < 2; ++rank) {
    outcome.exit[rank] = ranks[rank].Wait(absl::Seconds(60));
    EXPECT_TRUE(outcome.exit[rank].has_value()) << "rank " << rank << " hangs";
    outcome.out[rank] = ReadFileOrEmpty(dir.File(absl::StrCat("out", rank))) +
                        ReadFileOrEmpty(dir.File(absl::StrCat("err", rank)));
  }
  return outcome;
}

TEST(SyncFromSurvivorTest, TheNewestStateReachesEveryRank) {
  Outcome o = RunSync(/*source_dies=*/false);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(o.exit[rank].has_value() && o.exit[rank]->ok()) << o.out[rank];
    EXPECT_NE(
        o.out[rank].find(absl::StrCat(
            "rank ", rank, " synced from 0: record 9,90,900, tensors 9-9 9-9")),
        std::string::npos)
        << o.out[rank];
  }
}

TEST(SyncFromSurvivorTest, ASourceThatDiesMidSyncLeavesTheReceiverWhole) {
  Outcome o = RunSync(/*source_dies=*/true);
  ASSERT_TRUE(o.exit[0].has_value());
  EXPECT_EQ(o.exit[0]->exit_code, 3) << o.out[0];
  ASSERT_TRUE(o.exit[1].has_value() && o.exit[1]->ok()) << o.out[1];
  // The record had arrived; it is not applied without the tensors.
  EXPECT_NE(o.out[1].find("rank 1 failed ("), std::string::npos) << o.out[1];
  EXPECT_NE(o.out[1].find("record 5, tensors 5-5 5-5"), std::string::npos)
      << o.out[1];
}

}  // namespace
}  // namespace ddprun::worker
