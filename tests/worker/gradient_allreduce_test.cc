// The gradient allreduce (GradientAllreduce: shared memory in a node,
// hierarchical across nodes) in real worker processes:
// - under the real `ddprun`, one agent or two agents against a real
//   rendezvous server: sums of 1 float to 16 M floats equal the exact sum and
//   ProcessGroupGloo's (the reference), have the same bits on every rank, and
//   went the path that this layout must take;
// - a peer killed (kill -9) or stopped (SIGSTOP) mid-allreduce: the others
//   end with an error that names it, within the timeout, and leave no
//   segment behind. These run the workers without an agent, as ddprun would
//   itself stop the survivors of a dead worker at once.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"
#include "tests/worker/worker_test_util.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::ExitInfo;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::Subprocess;
using ::ddprun::testing::SubprocessOptions;
using ::ddprun::testing::TempDir;

std::string Helper() { return BinaryPath("tests/worker/allreduce_helper"); }

// rank_<R>.txt as written by allreduce_helper: the first word of each line
// to the rest ("size" lines keyed by their size).
std::map<std::string, std::string> ReadResult(const std::string& path) {
  std::map<std::string, std::string> result;
  for (absl::string_view line : absl::StrSplit(ReadFileOrEmpty(path), '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() < 2) continue;
    if (words[0] == "size") {
      result["size " + words[1]] = std::string(line);
    } else {
      result[words[0]] = words[1];
    }
  }
  return result;
}

struct Layout {
  std::string name;
  std::vector<int> nproc;  // per agent
  std::string path;        // the gradient path every rank must take
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

class UnderDdprunTest : public ::testing::TestWithParam<Layout> {};

// Runs `program` (the helper and its flags; --out-dir is added) under
// `layout`'s agents and waits for every agent to succeed; returns the world.
int RunUnderDdprun(const Layout& layout, const TempDir& dir,
                   std::vector<std::string> program) {
  program.insert(program.end(), {"--out-dir", dir.path()});
  std::unique_ptr<rendezvous::Server> server;
  if (layout.nproc.size() > 1) {
    auto started = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return 0;
    server = std::move(*started);
  }
  std::vector<Subprocess> agents;
  int world = 0;
  for (size_t agent = 0; agent < layout.nproc.size(); ++agent) {
    world += layout.nproc[agent];
    SubprocessOptions options;
    options.argv = {BinaryPath("launcher/ddprun"), "--nproc-per-node",
                    std::to_string(layout.nproc[agent]), "--monitor-interval",
                    "0.05"};
    if (server) {
      for (const std::string& flag :
           {std::string("--nnodes"), std::to_string(layout.nproc.size()),
            std::string("--node-rank"), std::to_string(agent),
            std::string("--rdzv-endpoint"), server->endpoint(),
            std::string("--rdzv-id"), layout.name}) {
        options.argv.push_back(flag);
      }
    } else {
      options.argv.push_back("--standalone");
    }
    options.argv.insert(options.argv.end(), program.begin(), program.end());
    options.stderr_path = dir.File(absl::StrCat("agent", agent, ".err"));
    auto started = Subprocess::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return 0;
    agents.push_back(std::move(*started));
  }
  for (size_t agent = 0; agent < agents.size(); ++agent) {
    std::optional<ExitInfo> exit = agents[agent].Wait(absl::Seconds(240));
    EXPECT_TRUE(exit.has_value()) << "agent " << agent << " still runs";
    if (!exit.has_value()) return 0;
    EXPECT_TRUE(exit->ok())
        << "agent " << agent << ": " << exit->ToString() << "\n"
        << ReadFileOrEmpty(dir.File(absl::StrCat("agent", agent, ".err")));
  }
  return world;
}

// Ranks in nodes of two or more: they reduce through shared memory.
int SharingRanks(const Layout& layout) {
  int ranks = 0;
  for (int n : layout.nproc) ranks += n >= 2 ? n : 0;
  return ranks;
}

// The sizes of every `--mode check` run, in floats.
const std::vector<int64_t> kCheckSizes = {1, 1024, 1 << 20, 16 << 20};

// Runs allreduce_helper --mode check (with `flags`) under `layout` and checks
// what every such run shows: each rank took the layout's path, every size
// is exact and equal to ProcessGroupGloo's sum, and every rank holds the
// same bits. `results` gets each rank's result file for the test's own
// checks.
void RunCheck(const Layout& layout, const std::vector<std::string>& flags,
              std::vector<std::map<std::string, std::string>>* results) {
  std::vector<std::string> size_strings;
  for (int64_t n : kCheckSizes) size_strings.push_back(std::to_string(n));
  std::vector<std::string> program = {Helper(), "--mode", "check"};
  program.insert(program.end(), flags.begin(), flags.end());
  program.insert(program.end(), {"--sizes", absl::StrJoin(size_strings, ",")});
  TempDir dir;
  const int world = RunUnderDdprun(layout, dir, program);
  ASSERT_GT(world, 0);
  std::map<int64_t, std::set<std::string>> bits;
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    results->push_back(
        ReadResult(dir.File(absl::StrCat("rank_", rank, ".txt"))));
    auto& result = results->back();
    EXPECT_EQ(result["path"], layout.path);
    for (int64_t n : kCheckSizes) {
      const std::string& line = result["size " + std::to_string(n)];
      EXPECT_TRUE(absl::StrContains(line, " exact 1 reference 1 ")) << line;
      std::vector<std::string> words = absl::StrSplit(line, ' ');
      ASSERT_EQ(words.size(), 8u) << line;
      bits[n].insert(words[7]);
    }
  }
  for (int64_t n : kCheckSizes) {
    EXPECT_EQ(bits[n].size(), 1u) << n << " floats: ranks hold different bits: "
                                  << absl::StrJoin(bits[n], " ");
  }
}

TEST_P(UnderDdprunTest, EverySizeIsExactTheSameOnEveryRankAndTookItsPath) {
  const Layout& layout = GetParam();
  const std::vector<int64_t>& sizes = kCheckSizes;
  std::vector<std::map<std::string, std::string>> results;
  ASSERT_NO_FATAL_FAILURE(RunCheck(layout, {}, &results));
  for (size_t rank = 0; rank < results.size(); ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    auto& result = results[rank];
    // One node's group forms Gloo only on its first collective (the
    // reference sums), and again after ReleaseIdleCollectives.
    const bool lazy = layout.path == "shared-memory";
    EXPECT_EQ(result["gloo_formed_at_start"], lazy ? "0" : "1");
    EXPECT_EQ(result["gloo_formed"], lazy ? "2" : "1");
    EXPECT_EQ(result["after_release_sum_ok"], "1");
    // Two sums per size, all through the path named above.
    EXPECT_EQ(result["runs"], layout.path == "process-group"
                                  ? "0"
                                  : std::to_string(2 * sizes.size()));
    // At 2 ranks in one node, calls of several 32 K-float slices (1 M and
    // 16 M floats) copy each slice in one slice ahead of its sum; 3+ local
    // ranks and the hierarchical path do not.
    const int64_t slice = 32 * 1024;
    EXPECT_EQ(result["pipelined_slices"],
              layout.nproc == std::vector<int>{2}
                  ? std::to_string(2 * ((1 << 20) / slice + (16 << 20) / slice))
                  : "0");
  }
}

TEST_P(UnderDdprunTest, BuffersInTheArenaAreSummedWhereTheyLieExactly) {
  // DataParallel's default gradients: LibTorch allocates the buffers while
  // a GradientArena serves their sizes from the node's shared memory, and
  // RunInPlace sums them where they lie. Exact and the same bits on every
  // rank at every size; inside a node of two or more every call took the
  // in-place path (counted), elsewhere RunInPlace is Run.
  const Layout& layout = GetParam();
  const std::vector<int64_t>& sizes = kCheckSizes;
  std::vector<std::map<std::string, std::string>> results;
  ASSERT_NO_FATAL_FAILURE(RunCheck(layout, {"--in-place"}, &results));
  const bool in_place = layout.path == "shared-memory";
  for (size_t rank = 0; rank < results.size(); ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    auto& result = results[rank];
    const std::string calls = std::to_string(2 * sizes.size());
    EXPECT_EQ(result["in_place_calls"], in_place ? calls : "0");
    EXPECT_EQ(result["in_place_fallbacks"], "0");
    EXPECT_EQ(result["runs"], layout.path == "process-group" ? "0" : calls);
    // No slice was copied through the segment's buffers.
    if (in_place) EXPECT_EQ(result["pipelined_slices"], "0");
    int64_t served = 0;
    ASSERT_TRUE(absl::SimpleAtoi(result["arena_served"], &served));
    if (in_place) {
      EXPECT_GE(served, static_cast<int64_t>(sizes.size()));
    } else {
      EXPECT_EQ(served, 0);
    }
  }
}

TEST_P(UnderDdprunTest, DataParallelSharedGradientsMatchTheProcessGroup) {
  // DataParallel's defaults: inside a node of two or more, backward's
  // gradients are allocated in shared memory and summed there; across
  // nodes copied through the segment. Bit for bit
  // what DataParallel over ProcessGroupGloo gives (integer-valued), over
  // dropped grads, a NoSync accumulation, and a step where rank 0's
  // program put a gradient of its own in (that bucket is copied, on every
  // rank); the grads keep their values once the DataParallel is gone.
  const Layout& layout = GetParam();
  TempDir dir;
  const int world =
      RunUnderDdprun(layout, dir, {Helper(), "--mode", "ddp-shared"});
  ASSERT_GT(world, 0);
  const bool in_place = layout.path == "shared-memory";
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    auto result = ReadResult(dir.File(absl::StrCat("rank_", rank, ".txt")));
    EXPECT_EQ(result["ddp_equal"], "1");
    // 5 syncs x 2 buckets; the last sync's weight bucket is copied.
    EXPECT_EQ(result["in_place_calls"], in_place ? "9" : "0");
    EXPECT_EQ(result["in_place_fallbacks"], in_place ? "1" : "0");
    const bool group_path = layout.path == "process-group";
    EXPECT_EQ(result["buckets_in_place"], in_place ? "9" : "0");
    EXPECT_EQ(result["buckets_copied"], in_place     ? "1"
                                        : group_path ? "0"
                                                     : "10");
    EXPECT_EQ(result["buckets_process_group"], group_path ? "10" : "0");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, UnderDdprunTest,
    ::testing::Values(
        Layout{"one_node_2", {2}, "shared-memory"},
        Layout{"one_node_3", {3}, "shared-memory"},
        Layout{"one_node_4", {4}, "shared-memory"},
        // Each agent alone in its node: nothing to share, Gloo carries all.
        Layout{"two_agents_1_1", {1, 1}, "process-group"},
        Layout{"two_agents_2_1", {2, 1}, "hierarchical"},
        Layout{"two_agents_2_2", {2, 2}, "hierarchical"}),
    [](const ::testing::TestParamInfo<Layout>& info) {
      return info.param.name;
    });

// Workers started as ddprun starts them, nodes told apart by their
// DDPRUN_SHM_DIR; one of them is killed or stopped while all loop.
class PeerFailureDuringAllreduceTest : public ::testing::Test {
 protected:
  void Start(const std::vector<int>& node_of_rank, int64_t timeout_ms,
             const std::vector<std::string>& extra = {}) {
    auto server = rendezvous::Server::Start({.host = "127.0.0.1", .port = 0});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    const int world = static_cast<int>(node_of_rank.size());
    std::map<int, int> local_count;
    for (int node : node_of_rank) ++local_count[node];
    std::map<int, int> next_local;
    for (int rank = 0; rank < world; ++rank) {
      const int node = node_of_rank[rank];
      std::string shm = shm_.File(absl::StrCat("node", node));
      std::filesystem::create_directories(shm);
      SubprocessOptions options;
      options.argv = {Helper(),    "--mode",       "loop",
                      "--sizes",   "1048576",      "--out-dir",
                      out_.path(), "--timeout-ms", std::to_string(timeout_ms)};
      options.argv.insert(options.argv.end(), extra.begin(), extra.end());
      options.env = testing::WorkerEnvFor(rank, world, server_->endpoint(),
                                          "peer-failure");
      options.env["LOCAL_RANK"] = std::to_string(next_local[node]++);
      options.env["LOCAL_WORLD_SIZE"] = std::to_string(local_count[node]);
      options.env["DDPRUN_SHM_DIR"] = shm;
      options.stderr_path = out_.File(absl::StrCat("err", rank));
      auto child = Subprocess::Start(options);
      ASSERT_TRUE(child.ok()) << child.status();
      ranks_.push_back(std::move(*child));
    }
  }

  bool Iterated(int rank, int iterations) {
    return absl::StrContains(
        ReadFileOrEmpty(out_.File(absl::StrCat("rank_", rank, ".txt"))),
        absl::StrCat("iteration ", iterations, "\n"));
  }

  // `rank`'s first `iterations` sums were all summed in place (its loop
  // writes the counters before each "iteration N" line).
  void ExpectSummedInPlace(int rank, int iterations) {
    const std::string out =
        ReadFileOrEmpty(out_.File(absl::StrCat("rank_", rank, ".txt")));
    EXPECT_TRUE(absl::StrContains(
        out,
        absl::StrCat("in_place_calls ", iterations,
                     " in_place_fallbacks 0\niteration ", iterations, "\n")))
        << out;
  }

  std::string Err(int rank) {
    return ReadFileOrEmpty(out_.File(absl::StrCat("err", rank)));
  }

  // Every rank but `victim` ends by itself, with exit code 1, within
  // `bound`; `victim`'s own node's ranks name it.
  void ExpectSurvivorsFail(int victim, const std::vector<int>& node_of_rank,
                           absl::Duration bound, const std::string& why) {
    absl::Time deadline = absl::Now() + bound;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      if (static_cast<int>(rank) == victim) continue;
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      std::optional<ExitInfo> exit =
          ranks_[rank].Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
      ASSERT_TRUE(exit.has_value())
          << "hung after rank " << victim << " " << why << "\n"
          << Err(rank);
      EXPECT_EQ(exit->exit_code, 1) << exit->ToString();
      std::string err = Err(rank);
      EXPECT_TRUE(
          absl::StrContains(err, "allreduce_helper: gradient allreduce"))
          << err;
      if (node_of_rank[rank] == node_of_rank[victim]) {
        EXPECT_TRUE(absl::StrContains(err, why)) << err;
      }
    }
  }

  // Nothing left: no process, no segment in any node's folder.
  void ExpectNothingLeft(int victim) {
    ranks_[victim].Signal(SIGKILL);
    ASSERT_TRUE(ranks_[victim].Wait(absl::Seconds(30)).has_value());
    for (const auto& node : std::filesystem::directory_iterator(shm_.path())) {
      for (const auto& file :
           std::filesystem::directory_iterator(node.path())) {
        ADD_FAILURE() << "left behind: " << file.path();
      }
    }
  }

  std::unique_ptr<rendezvous::Server> server_;
  TempDir out_;
  TempDir shm_;  // stands for the agents' DDPRUN_SHM_DIR folders
  std::vector<Subprocess> ranks_;
};

TEST_F(PeerFailureDuringAllreduceTest, KillNineInOneNode) {
  const std::vector<int> nodes = {0, 0, 0};
  Start(nodes, /*timeout_ms=*/120000);
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(1, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(1) << Err(2);
  ranks_[1].Signal(SIGKILL);
  // Long before the timeout: the death itself is seen.
  ExpectSurvivorsFail(1, nodes, absl::Seconds(60), "local rank 1");
  EXPECT_TRUE(absl::StrContains(Err(0) + Err(2), "died")) << Err(0) << Err(2);
  ExpectNothingLeft(1);
}

TEST_F(PeerFailureDuringAllreduceTest, KillNineInTheOtherNode) {
  const std::vector<int> nodes = {0, 0, 1, 1};
  Start(nodes, /*timeout_ms=*/120000);
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(3, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(3);
  ranks_[3].Signal(SIGKILL);
  ExpectSurvivorsFail(3, nodes, absl::Seconds(60), "local rank 1");
  EXPECT_TRUE(absl::StrContains(Err(2), "died")) << Err(2);
  ExpectNothingLeft(3);
}

TEST_F(PeerFailureDuringAllreduceTest, SigstopInOneNodeIsATimeoutNamingIt) {
  const std::vector<int> nodes = {0, 0};
  Start(nodes, /*timeout_ms=*/2000);
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(1, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(1);
  ranks_[1].Signal(SIGSTOP);
  ExpectSurvivorsFail(1, nodes, absl::Seconds(60), "stopped");
  ExpectNothingLeft(1);
}

// The same for buffers summed where they lie (DataParallel's shared
// gradients): the victim's buffer is read and written by the others. The
// victim's in-place counter shows that each of its sums took that path
// (none fell back to copies) before it was killed or stopped.
TEST_F(PeerFailureDuringAllreduceTest, KillNineDuringAnInPlaceSum) {
  const std::vector<int> nodes = {0, 0, 0};
  Start(nodes, /*timeout_ms=*/120000, {"--in-place"});
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(1, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(1) << Err(2);
  ExpectSummedInPlace(1, 3);
  ranks_[1].Signal(SIGKILL);
  ExpectSurvivorsFail(1, nodes, absl::Seconds(60), "local rank 1");
  EXPECT_TRUE(absl::StrContains(Err(0) + Err(2), "died")) << Err(0) << Err(2);
  ExpectNothingLeft(1);
}

TEST_F(PeerFailureDuringAllreduceTest, SigstopDuringAnInPlaceSum) {
  const std::vector<int> nodes = {0, 0};
  Start(nodes, /*timeout_ms=*/2000, {"--in-place"});
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(1, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(1);
  ExpectSummedInPlace(1, 3);
  ranks_[1].Signal(SIGSTOP);
  ExpectSurvivorsFail(1, nodes, absl::Seconds(60), "stopped");
  ExpectNothingLeft(1);
}

TEST_F(PeerFailureDuringAllreduceTest, SigstopInTheOtherNode) {
  const std::vector<int> nodes = {0, 0, 1, 1};
  Start(nodes, /*timeout_ms=*/2000);
  ASSERT_TRUE(::ddprun::testing::WaitFor([&] { return Iterated(3, 3); },
                                         absl::Seconds(120)))
      << Err(0) << Err(3);
  ranks_[3].Signal(SIGSTOP);
  ExpectSurvivorsFail(3, nodes, absl::Seconds(60), "stopped");
  ExpectNothingLeft(3);
}

}  // namespace
}  // namespace ddprun::worker
