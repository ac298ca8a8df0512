// A rendezvous restart loses nothing, shown with real processes: the
// ddprun-rendezvous binary on a kernel-chosen port, two ddprun agents with
// two workers each; the server is killed (SIGKILL) mid-round and started
// again on the same port. The agents resume the round from their records:
// no worker restarts (same pids), the round number and the restart count go
// on, a later real fault still counts against --max-restarts, and the job
// completes. With ddprun-mnist (where it is built) the workers train through
// the restart: they need the server's store only while a round forms.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/rendezvous_client.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/rendezvous_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int CountOf(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos;
       at = text.find(part, at + 1)) {
    ++n;
  }
  return n;
}

class RendezvousRestartTest : public ::testing::Test {
 protected:
  RendezvousRestartTest() : server_(dir_) {}

  void StartAgents(const std::string& run_id, int max_restarts,
                   const std::vector<std::string>& program) {
    for (int i = 0; i < 2; ++i) {
      SubprocessOptions options;
      options.argv = Concat(
          {Ddprun(), "--rdzv-endpoint", server_.endpoint(), "--rdzv-id", run_id,
           "--nnodes", "2", "--nproc-per-node", "2", "--node-rank",
           absl::StrCat(i), "--max-restarts", absl::StrCat(max_restarts),
           "--monitor-interval", "0.05", "--shutdown-grace", "2",
           // One test holds a node's workers (SIGSTOP): no hang.
           "--hang-bound", "stopped=0",
           // The tests compare the agents' children before and after; a
           // zygote (prewarming, ddprun-mnist's default) looks like a
           // worker for its first half second.
           "--no-prewarm",
           // A generous heartbeat timeout: the server is down a while.
           // is_host=0: the agents never serve the endpoint themselves.
           "--rdzv-conf",
           "heartbeat_interval=0.2,heartbeat_timeout=20,is_host=0"},
          program);
      options.stdout_path = dir_.File(absl::StrCat("agent", i, ".out"));
      options.stderr_path = dir_.File(absl::StrCat("agent", i, ".err"));
      absl::StatusOr<Subprocess> agent = Subprocess::Start(options);
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents_.push_back(*std::move(agent));
    }
  }

  std::string Logs() {
    std::string out = "--- rendezvous:\n" + server_.log();
    for (int i = 0; i < static_cast<int>(agents_.size()); ++i) {
      absl::StrAppend(
          &out, "--- agent ", i, ":\n",
          ReadFileOrEmpty(dir_.File(absl::StrCat("agent", i, ".err"))));
    }
    return out;
  }

  // Every worker of both agents, once each agent has `per_agent` of them.
  std::set<pid_t> WaitForWorkers(size_t per_agent) {
    std::set<pid_t> all;
    EXPECT_TRUE(WaitFor(
        [&] {
          all.clear();
          for (Subprocess& agent : agents_) {
            std::vector<pid_t> workers = Workers(agent.pid());
            if (workers.size() != per_agent) return false;
            all.insert(workers.begin(), workers.end());
          }
          return true;
        },
        absl::Seconds(60), absl::Milliseconds(20)))
        << Logs();
    return all;
  }

  std::set<pid_t> CurrentWorkers() {
    std::set<pid_t> all;
    for (Subprocess& agent : agents_) {
      std::vector<pid_t> workers = Workers(agent.pid());
      all.insert(workers.begin(), workers.end());
    }
    return all;
  }

  TempDir dir_;
  RendezvousProcess server_;
  std::vector<Subprocess> agents_;
};

// kill -9 of an agent whose server holds no heartbeat stream for it (the
// agent beats unary, as it does while it reopens a stream after a server
// restart): its orphan guard tells the server that the node is gone, so the
// other node goes on in a new round at once, though the job's heartbeat
// timeout (600 s here) would keep the dead node a member for ten minutes.
TEST_F(RendezvousRestartTest, AKilledAgentsGuardTellsTheServerTheNodeIsGone) {
  ASSERT_TRUE(server_.Start(0, {"--max-heartbeat-streams", "0"}))
      << server_.log();
  for (int i = 0; i < 2; ++i) {
    SubprocessOptions options;
    options.argv = {Ddprun(),
                    "--rdzv-endpoint",
                    server_.endpoint(),
                    "--rdzv-id",
                    "lost",
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    "1",
                    "--max-restarts",
                    "3",
                    "--monitor-interval",
                    "0.05",
                    "--rdzv-conf",
                    "heartbeat_interval=0.2,heartbeat_timeout=600,is_host=0",
                    "--no-python",
                    "sleep",
                    "600"};
    options.stdout_path = dir_.File(absl::StrCat("agent", i, ".out"));
    options.stderr_path = dir_.File(absl::StrCat("agent", i, ".err"));
    absl::StatusOr<Subprocess> agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents_.push_back(*std::move(agent));
  }
  int64_t round = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::optional<v1::JobStatus> job = server_.Job("lost");
        if (!job.has_value() || job->state() != v1::JOB_STATE_RUNNING) {
          return false;
        }
        int running = 0;
        for (const v1::NodeStatus& node : job->nodes()) {
          if (node.node_rank() >= 0 &&
              node.node_state() == v1::NODE_STATE_RUNNING) {
            ++running;
          }
        }
        round = job->round();
        return running == 2;
      },
      absl::Seconds(60), absl::Milliseconds(50)))
      << Logs();
  // The server counts a node running once its round closes, a moment
  // before its agent has forked the worker (seen once in CI): wait for it.
  ASSERT_TRUE(WaitFor([&] { return Workers(agents_[1].pid()).size() == 1u; },
                      absl::Seconds(10), absl::Milliseconds(10)))
      << Logs();

  ASSERT_EQ(kill(agents_[1].pid(), SIGKILL), 0);
  ASSERT_TRUE(agents_[1].Wait(absl::Seconds(10)).has_value());
  // A round after it, with the surviving node alone.
  EXPECT_TRUE(WaitFor(
      [&] {
        std::optional<v1::JobStatus> job = server_.Job("lost");
        if (!job.has_value() || job->state() != v1::JOB_STATE_RUNNING ||
            job->round() <= round) {
          return false;
        }
        int members = 0;
        for (const v1::NodeStatus& node : job->nodes()) {
          if (node.node_rank() >= 0) ++members;
        }
        return members == 1;
      },
      absl::Seconds(60), absl::Milliseconds(50)))
      << Logs();
  EXPECT_THAT(server_.log(), HasSubstr("its orphan guard says so")) << Logs();
}

// fault_worker: rank 0 fails once (restart count 0 -> 1), then every worker
// runs until restart count 2, when they all exit 0.
std::vector<std::string> FaultProgram(const TempDir& dir) {
  return {FaultWorker(), "--exit",
          "7",           "--fail-rank",
          "0",           "--fail-below-restart",
          "1",           "--hang-below-restart",
          "2",           "--out-dir",
          dir.path()};
}

class BudgetTest : public RendezvousRestartTest,
                   public ::testing::WithParamInterface<int> {};

// --max-restarts 2: the fault after the server restart is the second
// restart, and the job completes. --max-restarts 1: the same fault is one
// too many, and the job fails: the budget held across the restart.
TEST_P(BudgetTest, TheRoundAndTheRestartCountSurviveAServerRestart) {
  const int max_restarts = GetParam();
  ASSERT_TRUE(server_.Start(0)) << server_.log();
  StartAgents("restart-budget", max_restarts, FaultProgram(dir_));
  // Rank 0's failure made round 1, restart count 1.
  ASSERT_TRUE(server_.WaitForRunning("restart-budget", 1, 1, 2)) << Logs();
  std::set<pid_t> workers = WaitForWorkers(2);

  const int port = server_.port();
  ASSERT_TRUE(server_.KillNine());
  ASSERT_TRUE(server_.Start(port)) << server_.log();
  // The restarted server learns the round back from the agents' records.
  ASSERT_TRUE(server_.WaitForRunning("restart-budget", 1, 1, 2)) << Logs();
  EXPECT_EQ(CurrentWorkers(), workers) << "a worker restarted\n" << Logs();
  for (pid_t pid : workers) EXPECT_FALSE(ProcessGone(pid)) << pid;
  EXPECT_THAT(Logs(), HasSubstr("took round 1 back"));
  // `ddprun status` reads the same after the restart as before it.
  RunResult table =
      RunCommand({Ddprun(), "status", "--rdzv-endpoint", server_.endpoint(),
                  "--rdzv-id", "restart-budget"},
                 absl::Seconds(10));
  ASSERT_TRUE(table.exit.ok()) << table.err;
  EXPECT_THAT(table.out,
              HasSubstr(absl::StrCat("job restart-budget: running, round 1, "
                                     "world size 4, restarts 1/",
                                     max_restarts, ", nodes 2:2\n")));
  EXPECT_THAT(table.out, Not(HasSubstr("resuming")));
  EXPECT_EQ(CountOf(table.out, " running\n"), 2) << table.out;

  // A real fault after the restart counts: restart 2.
  ASSERT_EQ(kill(*workers.rbegin(), SIGKILL), 0);
  for (size_t i = 0; i < agents_.size(); ++i) {
    std::optional<ExitInfo> exit = agents_[i].Wait(absl::Seconds(90));
    ASSERT_TRUE(exit.has_value()) << Logs();
    if (max_restarts == 2) {
      EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << Logs();
    } else {
      EXPECT_EQ(exit->exit_code, 1) << Logs();
    }
  }
  std::optional<v1::JobStatus> job = server_.Job("restart-budget");
  ASSERT_TRUE(job.has_value()) << Logs();
  EXPECT_EQ(job->restart_count(), 2);
  if (max_restarts == 2) {
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << Logs();
    EXPECT_EQ(job->round(), 2);
  } else {
    EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << Logs();
    EXPECT_THAT(Logs(), HasSubstr("2 restarts used, max_restarts is 1"));
  }
}

INSTANTIATE_TEST_SUITE_P(MaxRestarts, BudgetTest, ::testing::Values(2, 1));

// Node 1's workers all finish while the server is down: its Leave fails.
// Once the server is back, node 1 tells it (a Resume with its record, then
// the Leave), so that the round rebuilt from the records does not wait for
// node 1 and end: node 0's workers are not restarted, and the job succeeds
// in round 0.
TEST_F(RendezvousRestartTest, ASuccessWhileTheServerIsDownIsNotLost) {
  ASSERT_TRUE(server_.Start(0)) << server_.log();
  for (int i = 0; i < 2; ++i) {
    SubprocessOptions options;
    options.argv = {Ddprun(),
                    "--rdzv-endpoint",
                    server_.endpoint(),
                    "--rdzv-id",
                    "finished",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--node-rank",
                    absl::StrCat(i),
                    "--monitor-interval",
                    "0.05",
                    "--rdzv-conf",
                    "heartbeat_interval=0.2,heartbeat_timeout=20,is_host=0",
                    "/bin/sleep",
                    i == 0 ? "20" : "3"};
    options.stdout_path = dir_.File(absl::StrCat("agent", i, ".out"));
    options.stderr_path = dir_.File(absl::StrCat("agent", i, ".err"));
    absl::StatusOr<Subprocess> agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents_.push_back(*std::move(agent));
  }
  ASSERT_TRUE(server_.WaitForRunning("finished", 0, 0, 2)) << Logs();
  // The server calls a node running once its round closes, which can be
  // before the agent has forked both workers: wait for them.
  std::vector<pid_t> node0_workers;
  ASSERT_TRUE(WaitFor(
      [&] {
        node0_workers = Children(agents_[0].pid());
        return node0_workers.size() == 2;
      },
      absl::Seconds(30), absl::Milliseconds(10)))
      << "node 0 has " << node0_workers.size() << " workers\n"
      << Logs();
  const int port = server_.port();
  ASSERT_TRUE(server_.KillNine());
  // Node 1's workers succeed while the server is down: its Leave finds no
  // server.
  ASSERT_TRUE(WaitFor([&] { return Children(agents_[1].pid()).empty(); },
                      absl::Seconds(60)))
      << Logs();
  ASSERT_TRUE(server_.Start(port)) << server_.log();
  std::optional<ExitInfo> exit1 = agents_[1].Wait(absl::Seconds(60));
  ASSERT_TRUE(exit1.has_value() && exit1->ok()) << Logs();
  EXPECT_EQ(Children(agents_[0].pid()), node0_workers)
      << "node 0's workers were restarted\n"
      << Logs();
  std::optional<ExitInfo> exit0 = agents_[0].Wait(absl::Seconds(90));
  ASSERT_TRUE(exit0.has_value() && exit0->ok()) << Logs();
  EXPECT_THAT(Logs(), HasSubstr("heard that this node's workers succeeded"));
  EXPECT_THAT(Logs(), Not(HasSubstr("round 1:")));
  std::optional<v1::JobStatus> job = server_.Job("finished");
  ASSERT_TRUE(job.has_value()) << Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << Logs();
  EXPECT_EQ(job->round(), 0);
  EXPECT_EQ(job->restart_count(), 0);
}

#ifdef DDPRUN_MNIST_BINARY
// ddprun-mnist trains through a server restart: same pids, same round and
// restart count, and the job completes with every rank's summary.
TEST_F(RendezvousRestartTest, MnistTrainsThroughAServerRestart) {
  ASSERT_TRUE(server_.Start(0)) << server_.log();
  StartAgents(
      "restart-mnist", 1,
      {DDPRUN_MNIST_BINARY, "--data-dir", MnistDir(), "--epochs", "3",
       "--train-limit", "12000", "--checkpoint-dir", dir_.File("checkpoints"),
       "--checkpoint-every", "10", "--summary-json", dir_.File("summary.json"),
       "--save", dir_.File("model.pt")});
  ASSERT_TRUE(server_.WaitForRunning("restart-mnist", 0, 0, 2)) << Logs();
  std::set<pid_t> workers = WaitForWorkers(2);
  // Mid-training: a first checkpoint is written.
  ASSERT_TRUE(WaitFor(
      [&] {
        return NewestCheckpointStep(dir_.File("checkpoints")).has_value();
      },
      absl::Minutes(3), absl::Milliseconds(50)))
      << Logs();

  // The workers are frozen while the server is away, so that a fast host
  // cannot finish the job before the server is back; their agents must
  // neither stop nor restart them, and once thawed they train on.
  const std::vector<pid_t> frozen(workers.begin(), workers.end());
  ASSERT_TRUE(FreezeProcesses(frozen));
  absl::Cleanup thaw = [&] { ThawProcesses(frozen); };
  const int port = server_.port();
  ASSERT_TRUE(server_.KillNine());
  const int64_t step_at_kill =
      NewestCheckpointStep(dir_.File("checkpoints")).value_or(0);
  ASSERT_TRUE(server_.Start(port)) << server_.log();
  ASSERT_TRUE(server_.WaitForRunning("restart-mnist", 0, 0, 2)) << Logs();
  EXPECT_EQ(CurrentWorkers(), workers) << "a worker restarted\n" << Logs();
  std::move(thaw).Invoke();
  // The same workers train on: a newer checkpoint comes.
  EXPECT_TRUE(WaitFor(
      [&] {
        return NewestCheckpointStep(dir_.File("checkpoints")).value_or(0) >
               step_at_kill;
      },
      absl::Minutes(3), absl::Milliseconds(50)))
      << Logs();

  for (size_t i = 0; i < agents_.size(); ++i) {
    std::optional<ExitInfo> exit = agents_[i].Wait(absl::Minutes(5));
    ASSERT_TRUE(exit.has_value()) << Logs();
    EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << Logs();
  }
  std::optional<v1::JobStatus> job = server_.Job("restart-mnist");
  ASSERT_TRUE(job.has_value()) << Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->round(), 0);
  EXPECT_EQ(job->restart_count(), 0);
  EXPECT_THAT(Logs(), Not(HasSubstr("stopping workers")));
  std::string summary =
      ExpectTrainedSummary(dir_.File("summary.json"), 4, /*min_accuracy=*/0.8);
  EXPECT_EQ(SummaryNumber(summary, "resumed_from_step"), -1)
      << "trained in one go: nothing resumed from a checkpoint";
}
#endif

}  // namespace
}  // namespace ddprun::testing
