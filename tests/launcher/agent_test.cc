// The whole agent as users run it: the real `ddprun` binary, real
// fault_worker processes, a real rendezvous server (in ddprun with
// --standalone, or in this process on port 0 for several agents).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The environment a fault_worker wrote, as a map.
std::map<std::string, std::string> ReadEnv(const std::string& path) {
  google::protobuf::Struct s;
  std::map<std::string, std::string> env;
  if (!google::protobuf::util::JsonStringToMessage(ReadFileOrEmpty(path), &s)
           .ok()) {
    return env;
  }
  for (const auto& [k, v] : s.fields()) env[k] = v.string_value();
  return env;
}

pid_t ReadPid(const std::string& path) {
  int pid = -1;
  if (!absl::SimpleAtoi(ReadFileOrEmpty(path), &pid)) return -1;
  return pid;
}

int Int(const std::string& s) {
  int v = -1;
  EXPECT_TRUE(absl::SimpleAtoi(s, &v)) << "'" << s << "'";
  return v;
}

// Common ddprun flags for quick tests.
std::vector<std::string> Standalone(int nproc) {
  return {Ddprun(),
          "--standalone",
          "--nproc-per-node",
          std::to_string(nproc),
          "--monitor-interval",
          "0.05",
          "--shutdown-grace",
          "2"};
}

TEST(AgentTest, TwoWorkersGetTheWholeEnvironment) {
  TempDir dir;
  RunResult r = RunCommand(
      Concat(Standalone(2), {FaultWorker(), "--out-dir", dir.path()}),
      absl::Seconds(30), {});
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  std::map<std::string, std::string> e0 = ReadEnv(dir.File("rank_0.env.json"));
  std::map<std::string, std::string> e1 = ReadEnv(dir.File("rank_1.env.json"));
  ASSERT_FALSE(e0.empty());
  ASSERT_FALSE(e1.empty());
  for (int i = 0; i < 2; ++i) {
    std::map<std::string, std::string>& e = i == 0 ? e0 : e1;
    SCOPED_TRACE(absl::StrCat("rank ", i));
    EXPECT_EQ(e["RANK"], std::to_string(i));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(i));
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "2");
    EXPECT_EQ(e["ROLE_NAME"], "default");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_GT(Int(e["MASTER_PORT"]), 0);
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_THAT(e["TORCHELASTIC_RUN_ID"], HasSubstr("standalone-"));
    EXPECT_THAT(e["TORCHELASTIC_ERROR_FILE"],
                HasSubstr(absl::StrCat("/attempt_0/", i, "/error.json")));
    EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1");
    EXPECT_THAT(e["DDPRUN_STORE_ENDPOINT"], HasSubstr("127.0.0.1:"));
    EXPECT_EQ(e["DDPRUN_STORE_RUN_ID"], e["TORCHELASTIC_RUN_ID"]);
    EXPECT_GE(Int(e["DDPRUN_ROUND"]), 0);
    EXPECT_EQ(e["DDPRUN_LOCAL_ADDR"], "127.0.0.1");
    EXPECT_GT(Int(e["DDPRUN_PROGRESS_FD"]), 2);
    EXPECT_EQ(e.count("DDPRUN_TOKEN_FILE"), 0u);
  }
  // One shared-memory folder per agent, gone with the agent.
  EXPECT_EQ(e0["DDPRUN_SHM_DIR"], e1["DDPRUN_SHM_DIR"]);
  EXPECT_THAT(e0["DDPRUN_SHM_DIR"], HasSubstr("/dev/shm/ddprun-"));
  EXPECT_FALSE(std::filesystem::exists(e0["DDPRUN_SHM_DIR"]));
  // One job, one master, one round; separate error files.
  EXPECT_EQ(e0["TORCHELASTIC_RUN_ID"], e1["TORCHELASTIC_RUN_ID"]);
  EXPECT_EQ(e0["MASTER_PORT"], e1["MASTER_PORT"]);
  EXPECT_EQ(e0["DDPRUN_ROUND"], e1["DDPRUN_ROUND"]);
  EXPECT_NE(e0["TORCHELASTIC_ERROR_FILE"], e1["TORCHELASTIC_ERROR_FILE"]);
  // MASTER_PORT is a port of its own, not the rendezvous'.
  EXPECT_THAT(e0["DDPRUN_STORE_ENDPOINT"],
              Not(HasSubstr(":" + e0["MASTER_PORT"])));
}

TEST(AgentTest, AFailingWorkerWithoutRestartsFailsTheJobWithASummary) {
  RunResult r = RunCommand(
      Concat(Standalone(2), {FaultWorker(), "--exit", "3", "--fail-rank", "1",
                             "--error-message", "ValueError: bad batch"}),
      absl::Seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 1) << r.err;
  EXPECT_EQ(CountLinesWith(r.err, "first failure"), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local rank 1) on 127.0.0.1"));
  EXPECT_THAT(r.err, HasSubstr("exit code 3"));
  EXPECT_THAT(r.err, HasSubstr("ValueError: bad batch"));
}

class SignalDeathTest : public ::testing::TestWithParam<int> {};

TEST_P(SignalDeathTest, TheSummaryNamesTheSignal) {
  int sig = GetParam();
  RunResult r = RunCommand(
      Concat(Standalone(1), {FaultWorker(), "--signal", std::to_string(sig)}),
      absl::Seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 1) << r.err;
  std::string name = sig == SIGKILL ? "SIGKILL" : "SIGSEGV";
  EXPECT_THAT(r.err, HasSubstr("killed by " + name)) << r.err;
}

INSTANTIATE_TEST_SUITE_P(KillAndSegv, SignalDeathTest,
                         ::testing::Values(SIGKILL, SIGSEGV));

TEST(AgentTest, RestartsAfterAFailureAndThenSucceeds) {
  TempDir dir;
  RunResult r = RunCommand(
      Concat(Standalone(2), {"--max-restarts", "2", FaultWorker(), "--exit",
                             "5", "--fail-rank", "0", "--fail-below-restart",
                             "1", "--out-dir", dir.path()}),
      absl::Seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 0) << r.err;
  // The files of the last round: every worker was restarted once.
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> e =
        ReadEnv(dir.File(absl::StrCat("rank_", rank, ".env.json")));
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "2");
  }
}

// The default prewarms only programs that say they wait for their round
// (libddp's AwaitActivation): this one never does, so its standbys would
// run before their round. Every restart starts it afresh.
TEST(AgentTest, AProgramThatNeverAwaitsItsRoundIsNotPrewarmedByDefault) {
  TempDir dir;
  RunResult r = RunCommand(
      Concat(Standalone(2), {"--max-restarts", "2", FaultWorker(), "--exit",
                             "5", "--fail-rank", "0", "--fail-below-restart",
                             "2", "--sleep", "0.5", "--out-dir", dir.path()}),
      absl::Seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 0) << r.err;
  EXPECT_EQ(CountLinesWith(r.err, "started 2 workers"), 3) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("prewarm"))) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("zygote"))) << r.err;
}

TEST(AgentTest, RestartsRunOutThenTheJobFails) {
  RunResult r = RunCommand(
      Concat(Standalone(1), {"--max-restarts", "2", FaultWorker(), "--exit",
                             "4", "--error-message", "always broken"}),
      absl::Seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("exit code 4"));
  EXPECT_THAT(r.err, HasSubstr("always broken"));
  EXPECT_EQ(CountLinesWith(r.err, "first failure"), 1) << r.err;
}

TEST(AgentTest, BadInputGivesOneClearLineQuickly) {
  struct Case {
    std::vector<std::string> argv;
    std::string expected;
  } cases[] = {
      {{Ddprun(), "--bogus-flag", "--standalone", FaultWorker()},
       "unknown flag '--bogus-flag'"},
      {{Ddprun(), "--standalone"}, "no program to run"},
      {{Ddprun(), "--standalone", "ddprun-no-such-program"},
       "cannot run 'ddprun-no-such-program'"},
      {{Ddprun(), "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
        "join_timeout=2,is_host=0", FaultWorker()},
       "ddprun-rendezvous runs there"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    absl::Time start = absl::Now();
    RunResult r = RunCommand(c.argv, absl::Seconds(20));
    EXPECT_FALSE(r.timed_out);
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    EXPECT_NE(r.exit.exit_code, 0);
    EXPECT_EQ(CountLinesWith(r.err, c.expected), 1) << r.err;
    EXPECT_EQ(CountLinesWith(r.err, "error"), 1) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("--help,-h")));  // no wall of help
  }
}

// Starts ddprun with workers that write pid files and hang, and waits until
// every worker is up.
struct RunningJob {
  Subprocess agent;
  std::vector<pid_t> workers;
};

absl::StatusOr<RunningJob> StartHangingJob(const TempDir& dir, int nproc,
                                           std::vector<std::string> extra) {
  SubprocessOptions options;
  options.argv = Concat(Standalone(nproc), extra);
  options.argv =
      Concat(options.argv, {FaultWorker(), "--hang", "--out-dir", dir.path()});
  options.stderr_path = dir.File("agent.err");
  absl::StatusOr<Subprocess> agent = Subprocess::Start(options);
  if (!agent.ok()) return agent.status();
  RunningJob job{std::move(*agent), {}};
  bool up = WaitFor(
      [&] {
        for (int i = 0; i < nproc; ++i) {
          if (ReadPid(dir.File(absl::StrCat("rank_", i, ".pid"))) <= 0) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(20));
  if (!up) {
    return absl::DeadlineExceededError("workers did not start: " +
                                       ReadFileOrEmpty(dir.File("agent.err")));
  }
  for (int i = 0; i < nproc; ++i) {
    job.workers.push_back(ReadPid(dir.File(absl::StrCat("rank_", i, ".pid"))));
  }
  return job;
}

bool AllGone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (!ProcessGone(pid)) return false;
  }
  return true;
}

class StopSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(StopSignalTest, IsForwardedAndEndsEveryWorker) {
  int sig = GetParam();
  TempDir dir;
  auto job = StartHangingJob(dir, 2, {});
  ASSERT_TRUE(job.ok()) << job.status();
  job->agent.Signal(sig);
  std::optional<ExitInfo> exit = job->agent.Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 1) << ReadFileOrEmpty(dir.File("agent.err"));
  EXPECT_TRUE(WaitFor([&] { return AllGone(job->workers); }, absl::Seconds(2)));
}

INSTANTIATE_TEST_SUITE_P(TorchrunsSignals, StopSignalTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT,
                                           SIGUSR1, SIGUSR2));

TEST(AgentTest, ChildrenOfWorkersDoNotOutliveTheJob) {
  TempDir dir;
  // The workers succeed at once but leave a child behind.
  RunResult r = RunCommand(
      Concat(Standalone(2),
             {FaultWorker(), "--spawn-grandchild", "--out-dir", dir.path()}),
      absl::Seconds(30));
  ASSERT_TRUE(r.exit.ok()) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    pid_t grandchild =
        ReadPid(dir.File(absl::StrCat("rank_", rank, ".grandchild.pid")));
    ASSERT_GT(grandchild, 0);
    EXPECT_TRUE(
        WaitFor([&] { return ProcessGone(grandchild); }, absl::Seconds(1)))
        << "rank " << rank << "'s child " << grandchild << " still runs";
  }
}

TEST(AgentTest, KillNineOfTheAgentLeavesNoWorkerWithinOneSecond) {
  TempDir dir;
  auto job = StartHangingJob(dir, 2, {});
  ASSERT_TRUE(job.ok()) << job.status();
  // Only the agent: its workers are in process groups of their own.
  job->agent.Signal(SIGKILL);
  ASSERT_TRUE(job->agent.Wait(absl::Seconds(5)).has_value());
  EXPECT_TRUE(WaitFor([&] { return AllGone(job->workers); }, absl::Seconds(1)));
}

TEST(AgentTest, AWorkerIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  SubprocessOptions options;
  options.argv = {Ddprun(),
                  "--standalone",
                  "--nproc-per-node",
                  "2",
                  "--monitor-interval",
                  "0.05",
                  "--shutdown-grace",
                  "1",
                  FaultWorker(),
                  "--hang",
                  "--ignore-sigterm",
                  "--out-dir",
                  dir.path()};
  options.stderr_path = dir.File("agent.err");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadPid(dir.File("rank_0.pid")) > 0 &&
               ReadPid(dir.File("rank_1.pid")) > 0;
      },
      absl::Seconds(20)))
      << ReadFileOrEmpty(dir.File("agent.err"));
  std::vector<pid_t> workers = {ReadPid(dir.File("rank_0.pid")),
                                ReadPid(dir.File("rank_1.pid"))};
  absl::Time start = absl::Now();
  agent->Signal(SIGINT);
  std::optional<ExitInfo> exit = agent->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(exit->exit_code, 1);
  EXPECT_TRUE(AllGone(workers));
  // SIGINT and SIGTERM were ignored; SIGKILL came after one shared grace.
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(AgentTest, AWorkerThatStopsReportingProgressIsHung) {
  absl::Time start = absl::Now();
  RunResult r =
      RunCommand(Concat(Standalone(2), {"--worker-timeout", "1", FaultWorker(),
                                        "--progress", "5", "--fail-rank", "1"}),
                 absl::Seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local rank 1)"));
  EXPECT_THAT(r.err, HasSubstr("hung"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// A Python program gets hang detection from ddprun's module: one
// progress.step() a step, and a silence past the step phase's bound is a
// hang, as for a libddp program. The same program without the module is
// waited for, as torchrun would.
TEST(AgentTest, APythonProgramThatReportsStepsIsFoundHungWhenItFallsSilent) {
  auto run = [](const std::string& mode) {
    return RunCommand(
        Concat(Standalone(1),
               {"--hang-bound", "step=1",
                SourcePath("tests/launcher/progress_pause.py"), mode}),
        absl::Seconds(60));
  };
  RunResult reporting = run("report");
  ASSERT_FALSE(reporting.timed_out);
  EXPECT_EQ(reporting.exit.exit_code, 1) << reporting.err;
  EXPECT_THAT(reporting.err, HasSubstr("in phase step")) << reporting.err;
  EXPECT_THAT(reporting.err, HasSubstr("is hung")) << reporting.err;
  RunResult quiet = run("quiet");
  ASSERT_FALSE(quiet.timed_out);
  EXPECT_EQ(quiet.exit.exit_code, 0) << quiet.err;
  EXPECT_THAT(quiet.err, Not(HasSubstr("hung"))) << quiet.err;
}

TEST(AgentTest, TwoAgentsFormOneJob) {
  rendezvous::ServerOptions server_options;
  auto server = rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  std::vector<Subprocess> agents;
  for (int i = 0; i < 2; ++i) {
    SubprocessOptions options;
    options.argv = {Ddprun(),
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--rdzv-endpoint",
                    (*server)->endpoint(),
                    "--rdzv-id",
                    "two-agents",
                    "--monitor-interval",
                    "0.05",
                    FaultWorker(),
                    "--out-dir",
                    dir.path()};
    options.stderr_path = dir.File(absl::StrCat("agent", i, ".err"));
    auto agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok());
    agents.push_back(std::move(*agent));
  }
  for (int i = 0; i < 2; ++i) {
    std::optional<ExitInfo> exit = agents[i].Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.has_value());
    EXPECT_TRUE(exit->ok())
        << ReadFileOrEmpty(dir.File(absl::StrCat("agent", i, ".err")));
  }
  std::map<std::string, std::string> e0 = ReadEnv(dir.File("rank_0.env.json"));
  std::map<std::string, std::string> e1 = ReadEnv(dir.File("rank_1.env.json"));
  EXPECT_EQ(e0["WORLD_SIZE"], "2");
  EXPECT_EQ(e1["WORLD_SIZE"], "2");
  EXPECT_EQ(e0["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(std::set<std::string>({e0["GROUP_RANK"], e1["GROUP_RANK"]}),
            std::set<std::string>({"0", "1"}));
  EXPECT_EQ(e0["LOCAL_RANK"], "0");
  EXPECT_EQ(e1["LOCAL_RANK"], "0");
  EXPECT_EQ(e0["MASTER_ADDR"], e1["MASTER_ADDR"]);
  EXPECT_EQ(e0["MASTER_PORT"], e1["MASTER_PORT"]);
  EXPECT_EQ(e0["TORCHELASTIC_RUN_ID"], "two-agents");
  EXPECT_EQ(e0["DDPRUN_STORE_ENDPOINT"], (*server)->endpoint());
}

// Agents of one job against an in-process rendezvous server.
class MultiAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // Starts agent `index` with `flags`, then the program.
  Subprocess& StartAgent(int index, const std::vector<std::string>& flags,
                         const std::vector<std::string>& program,
                         const std::map<std::string, std::string>& env = {}) {
    SubprocessOptions options;
    options.argv =
        Concat(Concat({Ddprun(), "--rdzv-endpoint", server_->endpoint(),
                       "--monitor-interval", "0.05", "--shutdown-grace", "2"},
                      flags),
               program);
    options.env = env;
    options.stdout_path = dir_.File(absl::StrCat("agent", index, ".out"));
    options.stderr_path = dir_.File(absl::StrCat("agent", index, ".err"));
    auto agent = Subprocess::Start(options);
    EXPECT_TRUE(agent.ok()) << agent.status();
    agents_.push_back(std::move(*agent));
    return agents_.back();
  }

  std::string AgentErr(int index) {
    return ReadFileOrEmpty(dir_.File(absl::StrCat("agent", index, ".err")));
  }

  void ExpectAllSucceed(absl::Duration timeout) {
    for (size_t i = 0; i < agents_.size(); ++i) {
      std::optional<ExitInfo> exit = agents_[i].Wait(timeout);
      ASSERT_TRUE(exit.has_value()) << "agent " << i << " still runs\n"
                                    << AgentErr(i);
      EXPECT_TRUE(exit->ok())
          << "agent " << i << ": " << exit->ToString() << "\n"
          << AgentErr(i);
    }
  }

  std::unique_ptr<rendezvous::Server> server_;
  TempDir dir_;
  std::vector<Subprocess> agents_;
};

TEST_F(MultiAgentTest, AFailureOnOneNodeRestartsBothNodes) {
  std::vector<std::string> flags = {
      "--nnodes",         "2",
      "--nproc-per-node", "1",
      "--rdzv-id",        "restart-both",
      "--max-restarts",   "1",
      "--rdzv-conf",      "heartbeat_interval=0.1"};
  // Global rank 0 fails in the first round; rank 1 runs until its agent
  // hears of it through the heartbeat and stops it.
  std::vector<std::string> program = {FaultWorker(), "--exit",
                                      "7",           "--fail-rank",
                                      "0",           "--fail-below-restart",
                                      "1",           "--hang-below-restart",
                                      "1",           "--out-dir",
                                      dir_.path()};
  StartAgent(0, flags, program);
  StartAgent(1, flags, program);
  ExpectAllSucceed(absl::Seconds(30));
  for (int rank = 0; rank < 2; ++rank) {
    auto e = ReadEnv(dir_.File(absl::StrCat("rank_", rank, ".env.json")));
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "1") << "rank " << rank;
    EXPECT_EQ(e["WORLD_SIZE"], "2");
  }
}

TEST_F(MultiAgentTest, TheSurvivorOfAKilledAgentContinuesAlone) {
  std::vector<std::string> flags = {
      "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-id", "survivor",
      "--rdzv-conf",
      // The last call waits long enough for the second agent to start on a
      // loaded machine (0.2 s let the first finish a round of its own).
      "heartbeat_interval=0.1,heartbeat_timeout=1,last_call_timeout=3"};
  // Workers run while the job has two nodes and finish once it has one.
  std::vector<std::string> program = {FaultWorker(), "--hang-if-world-size",
                                      "2", "--out-dir", dir_.path()};
  StartAgent(0, Concat(flags, {"--node-rank", "0"}), program);
  StartAgent(1, Concat(flags, {"--node-rank", "1"}), program);
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadPid(dir_.File("rank_0.pid")) > 0 &&
               ReadPid(dir_.File("rank_1.pid")) > 0;
      },
      absl::Seconds(20)))
      << AgentErr(0) << AgentErr(1);
  pid_t orphan_candidate = ReadPid(dir_.File("rank_1.pid"));
  agents_[1].Signal(SIGKILL);
  ASSERT_TRUE(agents_[1].Wait(absl::Seconds(5)).has_value());
  EXPECT_TRUE(
      WaitFor([&] { return ProcessGone(orphan_candidate); }, absl::Seconds(1)));
  std::optional<ExitInfo> exit = agents_[0].Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value()) << AgentErr(0);
  EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << AgentErr(0);
  auto e = ReadEnv(dir_.File("rank_0.env.json"));
  EXPECT_EQ(e["WORLD_SIZE"], "1");
  // Losing a node is a membership change, not a failure.
  EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
}

TEST_F(MultiAgentTest, ANodeJoiningARunningJobScalesItUp) {
  std::vector<std::string> flags = {
      "--nnodes",         "1:2",
      "--nproc-per-node", "1",
      "--rdzv-id",        "scale-up",
      "--rdzv-conf",      "heartbeat_interval=0.1,last_call_timeout=0.2"};
  // Workers run while the job has one node and finish once it has two.
  std::vector<std::string> program = {FaultWorker(), "--hang-if-world-size",
                                      "1", "--out-dir", dir_.path()};
  StartAgent(0, flags, program);
  ASSERT_TRUE(WaitFor([&] { return ReadPid(dir_.File("rank_0.pid")) > 0; },
                      absl::Seconds(20)))
      << AgentErr(0);
  StartAgent(1, flags, program);
  ExpectAllSucceed(absl::Seconds(30));
  for (int rank = 0; rank < 2; ++rank) {
    auto e = ReadEnv(dir_.File(absl::StrCat("rank_", rank, ".env.json")));
    EXPECT_EQ(e["WORLD_SIZE"], "2") << "rank " << rank;
  }
}

TEST_F(MultiAgentTest, ASignalWhileWaitingForPeersEndsPromptly) {
  // The second node never comes: the Join stays parked on the server.
  Subprocess& agent = StartAgent(0, {"--nnodes", "2", "--rdzv-id", "lonely"},
                                 {FaultWorker(), "--out-dir", dir_.path()});
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(AgentErr(0), "joining"); },
                      absl::Seconds(10)));
  absl::Time start = absl::Now();
  agent.Signal(SIGTERM);
  std::optional<ExitInfo> exit = agent.Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value()) << AgentErr(0);
  EXPECT_EQ(exit->exit_code, 1) << AgentErr(0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("rank_0.pid")));
}

TEST_F(MultiAgentTest, StatusShowsTheJobItsNodesAndRanks) {
  std::vector<std::string> flags = {"--nnodes", "2",         "--nproc-per-node",
                                    "2",        "--rdzv-id", "watched"};
  std::vector<std::string> program = {FaultWorker(), "--hang", "--out-dir",
                                      dir_.path()};
  StartAgent(0, flags, program);
  StartAgent(1, flags, program);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r = 0; r < 4; ++r) {
          if (ReadPid(dir_.File(absl::StrCat("rank_", r, ".pid"))) <= 0) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(20)));
  RunResult table = RunCommand({Ddprun(), "status", "--rdzv-endpoint",
                                server_->endpoint(), "--rdzv-id", "watched"},
                               absl::Seconds(10));
  ASSERT_TRUE(table.exit.ok()) << table.err;
  EXPECT_THAT(table.out, HasSubstr("job watched: running, round 0"));
  EXPECT_THAT(table.out, HasSubstr("world size 4"));
  EXPECT_THAT(table.out, HasSubstr("0-1"));
  EXPECT_THAT(table.out, HasSubstr("2-3"));
  RunResult json = RunCommand(
      {Ddprun(), "status", "--rdzv-endpoint", server_->endpoint(), "--json"},
      absl::Seconds(10));
  ASSERT_TRUE(json.exit.ok()) << json.err;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok())
      << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"run_id\": \"watched\""));
  for (Subprocess& agent : agents_) agent.Signal(SIGTERM);
  for (Subprocess& agent : agents_) {
    std::optional<ExitInfo> exit = agent.Wait(absl::Seconds(10));
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->exit_code, 1);
  }
}

TEST_F(MultiAgentTest, StatusOfAnUnreachableServerIsOneClearLine) {
  RunResult r = RunCommand(
      {Ddprun(), "status", "--rdzv-endpoint", "127.0.0.1:1", "--timeout", "2"},
      absl::Seconds(10));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit.exit_code, 1);
  EXPECT_EQ(CountLinesWith(r.err, "ddprun: error: Status to rendezvous"), 1)
      << r.err;
}

// An unmodified torch.distributed script (env://, Gloo) under two
// agents with two workers each, as under torchrun.
TEST_F(MultiAgentTest, UnmodifiedTorchDistributedScriptRuns) {
  const char* python = std::getenv("DDPRUN_TEST_PYTHON");
  std::string python_exec = python != nullptr ? python : "/usr/bin/python3";
  RunResult has_torch = RunCommand(
      {python_exec, "-c", "import torch.distributed"}, absl::Seconds(60));
  ASSERT_TRUE(has_torch.exit.ok())
      << python_exec << " cannot import torch (install python3-torch, or set "
      << "DDPRUN_TEST_PYTHON): " << has_torch.err;
  std::vector<std::string> flags = {"--nnodes", "2",         "--nproc-per-node",
                                    "2",        "--rdzv-id", "python-compat"};
  std::vector<std::string> program = {SourcePath("tests/launcher/allreduce.py"),
                                      dir_.path()};
  StartAgent(0, flags, program, {{"PYTHON_EXEC", python_exec}});
  StartAgent(1, flags, program, {{"PYTHON_EXEC", python_exec}});
  ExpectAllSucceed(
      absl::Seconds(240));  // torch imports are slow on a busy host
  std::set<std::string> group_ranks;
  for (int rank = 0; rank < 4; ++rank) {
    std::string result =
        ReadFileOrEmpty(dir_.File(absl::StrCat("rank_", rank, ".result")));
    std::vector<std::string> fields = absl::StrSplit(result, ' ');
    ASSERT_EQ(fields.size(), 4u) << "rank " << rank << ": '" << result << "'";
    EXPECT_EQ(fields[0], "4");     // world size
    EXPECT_EQ(fields[1], "10.0");  // 1 + 2 + 3 + 4
    EXPECT_EQ(fields[2], std::to_string(rank % 2));
    group_ranks.insert(std::string(absl::StripAsciiWhitespace(fields[3])));
  }
  EXPECT_EQ(group_ranks, std::set<std::string>({"0", "1"}));
}

TEST(AgentTest, AKilledWorkerIsRestarted) {
  TempDir dir;
  SubprocessOptions options;
  options.argv = Concat(Standalone(2),
                        {"--max-restarts", "1", FaultWorker(), "--hang",
                         "--fail-below-restart", "1", "--out-dir", dir.path()});
  options.stderr_path = dir.File("agent.err");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return ReadPid(dir.File("rank_1.pid")) > 0; },
                      absl::Seconds(20)));
  pid_t victim = ReadPid(dir.File("rank_1.pid"));
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  std::optional<ExitInfo> exit = agent->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  std::string err = ReadFileOrEmpty(dir.File("agent.err"));
  EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << err;
  EXPECT_THAT(err, HasSubstr("worker rank 1 (local 1) ended: signal SIGKILL"));
  auto e = ReadEnv(dir.File("rank_1.env.json"));
  EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "1");
}

TEST(AgentTest, LogDirRedirectsAndTee) {
  TempDir dir;
  std::string logs = dir.File("logs");
  RunResult r = RunCommand(Concat(Standalone(2), {"--log-dir",
                                                  logs,
                                                  "--rdzv-id",
                                                  "logged",
                                                  "--redirects",
                                                  "2",
                                                  "--tee",
                                                  "1",
                                                  "--max-restarts",
                                                  "1",
                                                  FaultWorker(),
                                                  "--print",
                                                  "hello from a worker",
                                                  "--exit",
                                                  "9",
                                                  "--error-message",
                                                  "first attempt fails",
                                                  "--fail-rank",
                                                  "1",
                                                  "--fail-below-restart",
                                                  "1"}),
                           absl::Seconds(30));
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  // Rank 0 of the failed attempt may be stopped before it prints (rank 1's
  // failure ends the group), so only the others are sure to have printed.
  // torchrun's layout: LOGDIR/<run_id>_<random>/attempt_<n>/<local_rank>/.
  std::vector<std::string> runs;
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    runs.push_back(entry.path().filename().string());
  }
  ASSERT_THAT(runs, ElementsAre(StartsWith("logged_")));
  std::string run = absl::StrCat(logs, "/", runs[0]);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      std::string base = absl::StrCat(run, "/attempt_", attempt, "/", rank);
      EXPECT_TRUE(std::filesystem::exists(base + "/stdout.log")) << base;
      EXPECT_TRUE(std::filesystem::exists(base + "/stderr.log")) << base;
      if (attempt == 1 || rank == 1) {
        EXPECT_EQ(ReadFileOrEmpty(base + "/stdout.log"),
                  "hello from a worker\n")
            << base;
      }
    }
  }
  // The failed attempt's error file is kept beside its logs.
  EXPECT_THAT(ReadFileOrEmpty(run + "/attempt_0/1/error.json"),
              HasSubstr("first attempt fails"));
  // Tee'd stdout reaches the console with torchrun's prefix (role and local
  // rank), once per attempt.
  int rank0_lines = CountLinesWith(r.out, "[default0]:hello from a worker");
  EXPECT_GE(rank0_lines, 1) << r.out;
  EXPECT_LE(rank0_lines, 2) << r.out;
  EXPECT_EQ(CountLinesWith(r.out, "[default1]:hello from a worker"), 2)
      << r.out;
}

TEST(AgentTest, LocalRanksFilterHidesOtherRanksFromTheConsole) {
  RunResult r =
      RunCommand(Concat(Standalone(2), {"--local-ranks-filter", "1",
                                        FaultWorker(), "--print", "visible?"}),
                 absl::Seconds(30));
  ASSERT_TRUE(r.exit.ok()) << r.err;
  EXPECT_EQ(CountLinesWith(r.out, "visible?"), 1) << r.out;
}

TEST(AgentTokenTest, TheTokenFileAuthenticatesTheAgentAndReachesWorkers) {
  rendezvous::ServerOptions server_options;
  server_options.token = "s3cret-token";
  auto server = rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    FILE* f = fopen(dir.File(name).c_str(), "w");
    fputs(text.c_str(), f);
    fclose(f);
    chmod(dir.File(name).c_str(), 0600);  // token files must be private
    return dir.File(name);
  };
  std::string good = write("good", "s3cret-token\n");
  std::string bad = write("bad", "guess\n");
  auto run = [&](const std::string& token_file) {
    return RunCommand(
        {Ddprun(), "--rdzv-endpoint", (*server)->endpoint(), "--rdzv-id",
         "tok-" + token_file.substr(token_file.size() - 3), "--token-file",
         token_file, FaultWorker(), "--out-dir", dir.path()},
        absl::Seconds(30));
  };
  RunResult refused = run(bad);
  EXPECT_EQ(refused.exit.exit_code, 1) << refused.err;
  EXPECT_EQ(CountLinesWith(refused.err, "check --token-file"), 1)
      << refused.err;
  RunResult admitted = run(good);
  EXPECT_TRUE(admitted.exit.ok()) << admitted.err;
  EXPECT_EQ(ReadEnv(dir.File("rank_0.env.json"))["DDPRUN_TOKEN_FILE"], good);
}

// --prewarm: the restarted workers were started ahead (torch imported)
// and still see exactly their round's environment.
TEST(AgentTest, PrewarmedPythonWorkersGetTheirRoundsEnvironment) {
  const char* python = std::getenv("DDPRUN_TEST_PYTHON");
  std::string python_exec = python != nullptr ? python : "/usr/bin/python3";
  TempDir dir;
  RunResult r = RunCommand(
      Concat(Standalone(2), {"--prewarm", "--max-restarts", "1",
                             SourcePath("tests/launcher/prewarm_check.py"),
                             dir.path(), "extra-arg"}),
      absl::Seconds(240), {{"PYTHON_EXEC", python_exec}});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr("activated prewarmed 2 workers"));
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    google::protobuf::Struct record;
    std::string text = ReadFileOrEmpty(
        dir.File(absl::StrCat("rank_", rank, "_restart_1.json")));
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &record).ok())
        << "'" << text << "'";
    const auto& f = record.fields();
    EXPECT_TRUE(f.at("torch_preloaded").bool_value());
    EXPECT_EQ(f.at("name").string_value(), "__main__");
    EXPECT_EQ(f.at("allreduce").number_value(), 2.0);
    const auto& argv = f.at("argv").list_value();
    ASSERT_EQ(argv.values_size(), 3);
    EXPECT_EQ(argv.values(0).string_value(),
              SourcePath("tests/launcher/prewarm_check.py"));
    EXPECT_EQ(argv.values(2).string_value(), "extra-arg");
    const auto& env = f.at("env").struct_value().fields();
    EXPECT_EQ(env.at("RANK").string_value(), std::to_string(rank));
    EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT").string_value(), "1");
    EXPECT_EQ(env.at("WORLD_SIZE").string_value(), "2");
    EXPECT_EQ(env.count("DDPRUN_STANDBY_FD"), 0u);
    EXPECT_EQ(env.at("OMP_NUM_THREADS").string_value(), "1");
  }
}

// Python programs are prewarmed only when asked (--prewarm): a standby is
// an interpreter with torch imported, per local rank.
TEST(AgentTest, PythonWorkersAreNotPrewarmedByDefault) {
  const char* python = std::getenv("DDPRUN_TEST_PYTHON");
  std::string python_exec = python != nullptr ? python : "/usr/bin/python3";
  TempDir dir;
  RunResult r = RunCommand(
      Concat(Standalone(2),
             {"--max-restarts", "1",
              SourcePath("tests/launcher/prewarm_check.py"), dir.path()}),
      absl::Seconds(240), {{"PYTHON_EXEC", python_exec}});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  EXPECT_EQ(CountLinesWith(r.err, "started 2 workers"), 2) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("prewarm"))) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    google::protobuf::Struct record;
    std::string text = ReadFileOrEmpty(
        dir.File(absl::StrCat("rank_", rank, "_restart_1.json")));
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &record).ok())
        << "'" << text << "'";
    EXPECT_FALSE(record.fields().at("torch_preloaded").bool_value());
  }
}

TEST(AgentTlsTest, TheAgentTalksTlsWithTheGivenCa) {
  TempDir certs;
  RunResult made =
      RunCommand({"/bin/sh", SourcePath("tests/rendezvous/make_test_certs.sh"),
                  certs.path()},
                 absl::Seconds(30));
  ASSERT_TRUE(made.exit.ok()) << made.err;
  rendezvous::ServerOptions server_options;
  server_options.tls.cert_file = certs.File("server.crt");
  server_options.tls.key_file = certs.File("server.key");
  auto server = rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  // The plaintext join cannot succeed: a short timeout ends it. The TLS
  // one gets time for its handshake on a loaded machine.
  auto run = [&](const std::string& id, const std::string& join_timeout,
                 std::vector<std::string> tls) {
    return RunCommand(
        Concat(Concat({Ddprun(), "--rdzv-endpoint", (*server)->endpoint(),
                       "--rdzv-id", id, "--rdzv-conf",
                       "join_timeout=" + join_timeout},
                      tls),
               {FaultWorker(), "--out-dir", dir.path()}),
        absl::Seconds(60));
  };
  RunResult plaintext = run("plain", "2", {});
  // The rendezvous never answered (a TLS server to a plaintext client):
  // EX_TEMPFAIL, which a service manager retries.
  EXPECT_EQ(plaintext.exit.exit_code, 75) << plaintext.err;
  EXPECT_EQ(CountLinesWith(plaintext.err, "--tls-ca-file"), 1) << plaintext.err;
  RunResult tls = run("tls", "30", {"--tls-ca-file", certs.File("ca.crt")});
  EXPECT_TRUE(tls.exit.ok()) << tls.exit.ToString() << "\n" << tls.err;
  EXPECT_EQ(ReadEnv(dir.File("rank_0.env.json"))["TORCHELASTIC_RUN_ID"], "tls");
}

}  // namespace
}  // namespace ddprun::testing
