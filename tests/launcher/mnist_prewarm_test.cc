// ddprun --prewarm with a C++ program: ddprun-mnist calls libddp's
// AwaitActivation after loading LibTorch and MNIST, so the agent keeps the
// next round's workers waiting there; after a kill -9 the restarted round is
// those processes (no process start, no data load), and the job still
// finishes with a good accuracy from its checkpoint. The standbys are forked
// by the node's zygote (worker/standby.h), which the tests check.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;

constexpr double kMinAccuracy = 0.85;

std::string ReadProc(pid_t pid, const char* what) {
  return ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/", what));
}

bool HasVariable(const std::string& environ, const std::string& name) {
  return absl::StrContains(environ,
                           absl::StrCat(std::string(1, '\0'), name, "=")) ||
         absl::StartsWith(environ, name + "=");
}

// The standbys' zygote (it names itself so): neither worker nor standby.
bool IsZygote(pid_t pid) { return ReadProc(pid, "comm") == "ddprun-zygote\n"; }

// The direct children of `pid`: its workers, its standbys and the zygote.
// A standby was started with DDPRUN_STANDBY_FD, or forked by the zygote,
// which was started with DDPRUN_ZYGOTE_FD; /proc keeps the original
// environment block even after the process replaced its environment.
bool IsStandby(pid_t pid) {
  std::string environ = ReadProc(pid, "environ");
  return HasVariable(environ, "DDPRUN_STANDBY_FD") ||
         (HasVariable(environ, "DDPRUN_ZYGOTE_FD") && !IsZygote(pid));
}

// Started by the agent for this round: neither standby nor zygote.
bool IsWorker(pid_t pid) { return !IsStandby(pid) && !IsZygote(pid); }

// Blocked reading its pipe: loaded, waiting for its round.
bool WaitsOnPipe(pid_t pid) {
  return absl::EndsWith(ReadProc(pid, "wchan"), "pipe_read");
}

// A complete checkpoint (not only the temporary file of the first).
bool HasCheckpoint(const TempDir& dir) {
  return NewestCheckpointStep(dir.File("checkpoints")).has_value();
}

TEST(MnistPrewarmTest, AKilledWorkerIsReplacedByPrewarmedProcesses) {
  TempDir dir;
  SubprocessOptions options;
  options.argv = {BinaryPath("launcher/ddprun"), "--prewarm", "--standalone",
                  "--nproc-per-node", "2", "--max-restarts", "2",
                  "--monitor-interval", "0.1",
                  // The workers are held (SIGSTOP) while the standbys
                  // get ready.
                  "--hang-bound", "stopped=0", BinaryPath("mnist/ddprun-mnist"),
                  "--epochs", "4", "--data-dir", MnistDir(), "--checkpoint-dir",
                  dir.File("checkpoints"), "--checkpoint-every", "50",
                  "--summary-json", dir.File("summary.json"), "--save", "",
                  // These tests are of restarts from a checkpoint (in-place
                  // recovery: mnist_inplace_test.cc).
                  "--no-in-place"};
  options.stderr_path = dir.File("agent.err");
  options.stdout_path = dir.File("agent.out");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto err = [&] { return ReadFileOrEmpty(options.stderr_path); };

  // Mid-training: a checkpoint saved, then both workers frozen, so that they
  // write no other checkpoint and the job cannot end, however fast this host
  // trains, before the next round's two standbys are loaded and waiting.
  std::vector<pid_t> workers;
  bool ended_early = false;
  ASSERT_TRUE(WaitFor(
      [&] {
        if (agent->Poll().has_value()) return ended_early = true;
        if (!HasCheckpoint(dir)) return false;
        workers.clear();
        for (pid_t pid : Children(agent->pid())) {
          if (IsWorker(pid)) workers.push_back(pid);
        }
        return workers.size() == 2;
      },
      absl::Minutes(2)))
      << err();
  ASSERT_FALSE(ended_early) << "the job ended before its first checkpoint\n"
                            << err();
  ASSERT_TRUE(FreezeProcesses(workers));
  std::set<pid_t> standbys;
  ASSERT_TRUE(WaitFor(
      [&] {
        standbys.clear();
        for (pid_t pid : Children(agent->pid())) {
          if (IsStandby(pid) && WaitsOnPipe(pid)) standbys.insert(pid);
        }
        return standbys.size() == 2;
      },
      absl::Minutes(2)))
      << err();
  std::optional<int64_t> resume_step =
      NewestCheckpointStep(dir.File("checkpoints"));
  ASSERT_TRUE(resume_step.has_value());
  ASSERT_EQ(kill(workers.back(), SIGKILL), 0);

  std::optional<ExitInfo> exit = agent->Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << err();
  std::string log = err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << log;
  EXPECT_THAT(log, HasSubstr("signal SIGKILL"));
  EXPECT_THAT(log, HasSubstr("restart 1/2"));
  EXPECT_THAT(log, HasSubstr("activated prewarmed 2 workers"));
  // The restarted round's ranks are the standbys that waited at the kill.
  std::set<pid_t> activated;
  std::regex line(R"(prewarmed process (\d+) activated as rank (\d+))");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end;
       ++it) {
    activated.insert(std::stoi((*it)[1]));
  }
  EXPECT_EQ(activated, standbys) << log;
  // The fast path: both were forked by the zygote, not started by exec.
  EXPECT_THAT(log, HasSubstr("prewarmed workers fork from a zygote"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("start by exec from now on")));
  std::regex forked(
      R"(prewarmed process (\d+) activated as rank \d+ after [^\n]* )"
      R"(\(forked by the zygote, pid \d+\))");
  std::set<pid_t> forked_activated;
  for (std::sregex_iterator it(log.begin(), log.end(), forked), end; it != end;
       ++it) {
    forked_activated.insert(std::stoi((*it)[1]));
  }
  EXPECT_EQ(forked_activated, standbys) << log;

  std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ASSERT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json\n" << log;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), 2) << summary;
  ExpectResumedFrom(dir.File("summary.json"), *resume_step);
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  ASSERT_TRUE(accuracy.has_value()) << summary;
  EXPECT_GE(*accuracy, kMinAccuracy) << summary;
}

// Two nodes, one rank each: the node whose worker is killed and the node
// whose worker only loses its peer both restart with their standbys (ranks
// other than 0 are activated at once: libddp meets at the store).
TEST(MnistPrewarmTest, TwoNodesRestartWithTheirStandbys) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  std::vector<Subprocess> agents;
  for (int node = 0; node < 2; ++node) {
    SubprocessOptions options;
    options.argv = {BinaryPath("launcher/ddprun"),
                    "--prewarm",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--node-rank",
                    std::to_string(node),
                    "--rdzv-endpoint",
                    (*server)->endpoint(),
                    "--rdzv-id",
                    "prewarm-2",
                    "--max-restarts",
                    "2",
                    "--monitor-interval",
                    "0.1",
                    "--hang-bound",
                    "stopped=0",  // workers held (SIGSTOP)
                    "--rdzv-conf",
                    "heartbeat_interval=0.2",
                    BinaryPath("mnist/ddprun-mnist"),
                    "--epochs",
                    "4",
                    "--data-dir",
                    MnistDir(),
                    "--checkpoint-dir",
                    dir.File("checkpoints"),
                    "--checkpoint-every",
                    "50",
                    "--summary-json",
                    dir.File("summary.json"),
                    "--save",
                    "",
                    "--no-in-place"};
    options.stderr_path = dir.File(absl::StrCat("agent", node, ".err"));
    auto agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents.push_back(std::move(*agent));
  }
  auto logs = [&] {
    return ReadFileOrEmpty(dir.File("agent0.err")) + "\n---\n" +
           ReadFileOrEmpty(dir.File("agent1.err"));
  };
  // As above: the workers are frozen at their first checkpoint, then the
  // standbys awaited, so a fast host cannot end the job first.
  std::vector<pid_t> workers;
  pid_t victim = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        if (!HasCheckpoint(dir)) return false;
        workers.clear();
        victim = -1;
        for (Subprocess& agent : agents) {
          for (pid_t pid : Children(agent.pid())) {
            if (IsWorker(pid)) workers.push_back(pid);
          }
        }
        for (pid_t pid : Children(agents[1].pid())) {
          if (IsWorker(pid)) victim = pid;
        }
        return workers.size() == 2 && victim > 0;
      },
      absl::Minutes(2)))
      << logs();
  ASSERT_TRUE(FreezeProcesses(workers));
  ASSERT_TRUE(WaitFor(
      [&] {
        int waiting = 0;
        for (Subprocess& agent : agents) {
          for (pid_t pid : Children(agent.pid())) {
            if (IsStandby(pid) && WaitsOnPipe(pid)) ++waiting;
          }
        }
        return waiting == 2;
      },
      absl::Minutes(2)))
      << logs();
  std::optional<int64_t> resume_step =
      NewestCheckpointStep(dir.File("checkpoints"));
  ASSERT_TRUE(resume_step.has_value());
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  for (Subprocess& agent : agents) {
    std::optional<ExitInfo> exit = agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(exit.has_value()) << logs();
    EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << logs();
  }
  for (int node = 0; node < 2; ++node) {
    const std::string log =
        ReadFileOrEmpty(dir.File(absl::StrCat("agent", node, ".err")));
    EXPECT_THAT(log, HasSubstr("activated prewarmed 1 workers")) << logs();
    EXPECT_THAT(log, HasSubstr("(forked by the zygote, pid")) << logs();
  }
  std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ASSERT_FALSE(summary.empty()) << logs();
  EXPECT_EQ(SummaryNumber(summary, "world_size"), 2) << summary;
  EXPECT_GE(SummaryNumber(summary, "test_accuracy").value_or(0), kMinAccuracy)
      << summary;
  ExpectResumedFrom(dir.File("summary.json"), *resume_step);
}

}  // namespace
}  // namespace ddprun::testing
