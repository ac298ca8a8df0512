// torchrun's rendezvous forms with ddprun and no ddprun-rendezvous: the
// plain single-node line, the stacked one on port 0, two agents sharing one
// --rdzv-endpoint (the agent on that host serves it) and the static form
// (--master-addr/--master-port/--node-rank). Real agents, real workers.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;

std::map<std::string, std::string> ReadEnv(const std::string& path) {
  std::map<std::string, std::string> out;
  google::protobuf::Struct s;
  if (!google::protobuf::util::JsonStringToMessage(ReadFileOrEmpty(path), &s)
           .ok()) {
    return out;
  }
  for (const auto& [k, v] : s.fields()) out[k] = v.string_value();
  return out;
}

// A loopback port free now (the kernel's pick, released).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

TEST(DropinTest, PlainSingleNodeLineIsStandalone) {
  TempDir dir;
  RunResult r =
      RunCommand({Ddprun(), "--nproc-per-node", "2", "--monitor-interval",
                  "0.05", FaultWorker(), "--out-dir", dir.path()},
                 absl::Seconds(60));
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr("standalone rendezvous"));
  EXPECT_EQ(ReadEnv(dir.File("rank_1.env.json"))["WORLD_SIZE"], "2");
}

TEST(DropinTest, StackedSingleNodeOnPortZero) {
  TempDir dir;
  RunResult r = RunCommand(
      {Ddprun(), "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
       "--nnodes", "1", "--nproc_per_node", "2", "--monitor-interval", "0.05",
       FaultWorker(), "--out-dir", dir.path()},
      absl::Seconds(60));
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr("serving the rendezvous on localhost:"));
  EXPECT_EQ(ReadEnv(dir.File("rank_0.env.json"))["WORLD_SIZE"], "2");
}

TEST(DropinTest, TorchrunsLinePrefixAndItsTemplate) {
  // --tee without --log-dir keeps the logs in a temporary folder, as
  // torchrun does: under TMPDIR, the test's own.
  TempDir tmp;
  std::vector<std::string> line = {
      Ddprun(), "--nproc-per-node", "2",           "--tee",   "3",
      "--role", "trainer",          FaultWorker(), "--print", "hi"};
  RunResult plain =
      RunCommand(line, absl::Seconds(60), {{"TMPDIR", tmp.path()}});
  ASSERT_TRUE(plain.exit.ok()) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("[trainer1]:hi\n"));
  RunResult templated = RunCommand(line, absl::Seconds(60),
                                   {{"TMPDIR", tmp.path()},
                                    {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
                                     "${role_name}-${rank}-${local_rank}> "}});
  ASSERT_TRUE(templated.exit.ok()) << templated.err;
  EXPECT_THAT(templated.out, HasSubstr("trainer-1-1> hi\n"));
}

struct Agents {
  TempDir dir;
  std::vector<Subprocess> procs;

  void Start(int i, std::vector<std::string> argv) {
    SubprocessOptions options;
    options.argv = Concat(std::move(argv),
                          {"--monitor-interval", "0.05", FaultWorker(),
                           "--out-dir", dir.File(absl::StrCat("out", i))});
    options.stderr_path = Err(i);
    std::filesystem::create_directories(dir.File(absl::StrCat("out", i)));
    auto agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    procs.push_back(std::move(*agent));
  }
  std::string Err(int i) { return dir.File(absl::StrCat("agent", i, ".err")); }
  std::map<std::string, std::string> Env(int agent, int rank) {
    return ReadEnv(
        dir.File(absl::StrCat("out", agent, "/rank_", rank, ".env.json")));
  }
  void ExpectAllSucceed() {
    for (size_t i = 0; i < procs.size(); ++i) {
      std::optional<ExitInfo> exit = procs[i].Wait(absl::Seconds(90));
      ASSERT_TRUE(exit.has_value()) << "agent " << i << " still running";
      EXPECT_TRUE(exit->ok())
          << "agent " << i << ": " << exit->ToString() << "\n"
          << ReadFileOrEmpty(Err(i));
    }
  }
};

TEST(DropinTest, TwoAgentsWithOneEndpointAndNoServer) {
  std::string endpoint = absl::StrCat("127.0.0.1:", FreePort());
  Agents agents;
  for (int i = 0; i < 2; ++i) {
    agents.Start(i, {Ddprun(), "--nnodes", "2", "--nproc-per-node", "1",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                     "--rdzv-id", "shared-endpoint"});
  }
  agents.ExpectAllSucceed();
  int served = 0;
  for (int i = 0; i < 2; ++i) {
    served += absl::StrContains(ReadFileOrEmpty(agents.Err(i)),
                                "serving the rendezvous on " + endpoint);
  }
  EXPECT_EQ(served, 1) << "exactly one agent serves the rendezvous";
  // One job of two nodes: each agent's single worker has one of the ranks.
  std::map<std::string, std::string> a = agents.Env(0, 0);
  if (a.empty()) a = agents.Env(0, 1);
  std::map<std::string, std::string> b = agents.Env(1, 0);
  if (b.empty()) b = agents.Env(1, 1);
  EXPECT_EQ(a["WORLD_SIZE"], "2");
  EXPECT_EQ(b["WORLD_SIZE"], "2");
  EXPECT_NE(a["RANK"], b["RANK"]);
  EXPECT_EQ(a["TORCHELASTIC_RUN_ID"], "shared-endpoint");
  EXPECT_EQ(a["MASTER_PORT"], b["MASTER_PORT"]);
}

TEST(DropinTest, StaticTwoNodesOnLoopback) {
  std::string port = std::to_string(FreePort());
  Agents agents;
  // Node rank 1 first: it waits for node rank 0, which serves.
  for (int rank : {1, 0}) {
    agents.Start(rank, {Ddprun(), "--nnodes", "2", "--nproc_per_node", "2",
                        "--node_rank", std::to_string(rank), "--master_addr",
                        "127.0.0.1", "--master_port", port});
  }
  agents.ExpectAllSucceed();
  EXPECT_THAT(ReadFileOrEmpty(agents.Err(0)),
              HasSubstr("serving the rendezvous on 127.0.0.1:" + port));
  EXPECT_THAT(ReadFileOrEmpty(agents.Err(1)),
              ::testing::Not(HasSubstr("serving the rendezvous")));
  // Node rank R holds global ranks 2R and 2R+1, as torchrun's static form.
  for (int node : {0, 1}) {
    for (int local : {0, 1}) {
      std::map<std::string, std::string> e = agents.Env(node, 2 * node + local);
      SCOPED_TRACE(absl::StrCat("node ", node, " local ", local));
      EXPECT_EQ(e["GROUP_RANK"], std::to_string(node));
      EXPECT_EQ(e["LOCAL_RANK"], std::to_string(local));
      EXPECT_EQ(e["WORLD_SIZE"], "4");
    }
  }
}

}  // namespace
}  // namespace ddprun::testing
