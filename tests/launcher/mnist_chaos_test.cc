// The seeded chaos test, with real processes only: ddprun-rendezvous
// on a kernel-chosen port, two ddprun agents (two nodes on this host) with
// two ddprun-mnist workers each, real MNIST, in-place recovery on and
// checkpoints on. A seeded plan injects each kind of fault once, in a
// seeded order, each when training has reached a seeded step past the
// previous recovery (checkpoint files are the step counter; no timers):
//   - kill -9 of a worker,
//   - SIGSTOP of a worker (a hang),
//   - kill -9 of an agent (its node is lost), then the agent started again,
//   - kill -9 of ddprun-rendezvous, then started again on its port.
// It asserts that the job completes; that the accuracy is within half a
// point of the fault-free run of the same command and seed (run first, in
// the same test); that every epoch's sample accounting in --summary-json is
// exact; that the restart count equals the worker faults (a lost node is
// no failure) and every recovery, the agent kill's too, is in place;
// that the workers of the node a worker fault did not touch keep their pids;
// that after the server restart the round and the restart count go on, not
// back to 0. DDPRUN_CHAOS_SEED replays another seed. Registered only in
// builds that have ddprun-mnist (it needs LibTorch).
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/rendezvous_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

// Divisible by the per-step batch of world 4 (4 x 32), so that every epoch
// is exactly this many samples (no padding): 94 steps an epoch.
constexpr int kTrainSamples = 12000;
constexpr int kEpochs = 5;
constexpr int kCheckpointEvery = 10;
constexpr int kNodes = 2;
constexpr int kPerNode = 2;
constexpr int kMaxRestarts = 9;
// Within half a point of the fault-free run with the same seed: recovery
// may reorder a few sums, never lose or repeat samples.
constexpr double kAccuracyTolerance = 0.005;
constexpr uint32_t kDefaultSeed = 20261203;
// Generous bounds for a loaded machine; the waits end as soon as their
// condition holds.
constexpr absl::Duration kRecoveryBound = absl::Minutes(2);
constexpr absl::Duration kJobBound = absl::Minutes(5);

uint32_t ChaosSeed() {
  const char* text = std::getenv("DDPRUN_CHAOS_SEED");
  uint32_t seed = 0;
  if (text != nullptr && absl::SimpleAtoi(text, &seed)) return seed;
  return kDefaultSeed;
}

enum class Fault { kWorkerKill, kWorkerHang, kAgentKill, kServerKill };

std::string FaultName(Fault fault) {
  switch (fault) {
    case Fault::kWorkerKill:
      return "kill -9 of a worker";
    case Fault::kWorkerHang:
      return "SIGSTOP of a worker";
    case Fault::kAgentKill:
      return "kill -9 of an agent, started again";
    case Fault::kServerKill:
      return "kill -9 of ddprun-rendezvous, started again";
  }
  return "?";
}

// The new rounds (each one restart of --max-restarts) a fault takes.
int NewRounds(Fault fault) {
  switch (fault) {
    case Fault::kWorkerKill:
      // The worker's agent sees it die and reports the failure: one new
      // round, in which that agent replaces the lost rank in place.
      return 1;
    case Fault::kWorkerHang:
      // The stopped worker is found by its state (stopped past 100 ms); its
      // agent kills it and reports it: one new round, as for a kill.
      return 1;
    case Fault::kAgentKill:
      // The agent's workers die with it (PDEATHSIG) and its heartbeat
      // stream breaks: the server drops the node a second later, which ends
      // the round (no restart), and the other node's workers wait in place
      // for the next one, which the agent started again joins.
      return 1;
    case Fault::kServerKill:
      // Nothing failed: the agents hand the restarted server their round
      // back from their records, and the workers do not need the server
      // between rounds. No new round.
      return 0;
  }
  return 0;
}

// Restarts a fault costs: a lost node is not a failure.
int NewRestarts(Fault fault) {
  return fault == Fault::kAgentKill ? 0 : NewRounds(fault);
}

struct PlannedFault {
  Fault kind;
  int node;         // the node of the worker or agent it hits
  int local_rank;   // the worker's, for worker faults
  int after_steps;  // training steps past the previous recovery
};

// Each kind once, in a seeded order in which the server kill is never the
// first fault (so that there is a round and a count for it to keep), at a
// seeded node and worker, a seeded number of steps apart.
std::vector<PlannedFault> Plan(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Fault> kinds = {Fault::kWorkerKill, Fault::kWorkerHang,
                              Fault::kAgentKill, Fault::kServerKill};
  std::shuffle(kinds.begin(), kinds.end(), rng);
  if (kinds.front() == Fault::kServerKill) std::swap(kinds[0], kinds[1]);
  std::vector<PlannedFault> plan;
  for (Fault kind : kinds) {
    PlannedFault fault;
    fault.kind = kind;
    fault.node = std::uniform_int_distribution<int>(0, kNodes - 1)(rng);
    fault.local_rank = std::uniform_int_distribution<int>(0, kPerNode - 1)(rng);
    fault.after_steps =
        kCheckpointEvery * std::uniform_int_distribution<int>(1, 3)(rng);
    plan.push_back(fault);
  }
  return plan;
}

std::string Describe(const std::vector<PlannedFault>& plan, uint32_t seed) {
  std::string out = absl::StrCat("chaos plan of seed ", seed, ":");
  for (const PlannedFault& f : plan) {
    absl::StrAppend(&out, "\n  after ", f.after_steps,
                    " steps: ", FaultName(f.kind), " (node ", f.node);
    if (f.kind == Fault::kWorkerKill || f.kind == Fault::kWorkerHang) {
      absl::StrAppend(&out, ", local rank ", f.local_rank);
    }
    absl::StrAppend(&out, ")");
  }
  return out;
}

// The survivors' "into round R ... stopped at step N, resuming at step M"
// lines: round -> (N, M) of each survivor.
std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> InPlaceResumes(
    const std::string& log) {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> out;
  std::regex re(
      "into round ([0-9]+) as rank [0-9]+ of [0-9]+: stopped at step "
      "([0-9]+), resuming at step ([0-9]+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re);
       it != std::sregex_iterator(); ++it) {
    out[std::stoll((*it)[1])].emplace_back(std::stoll((*it)[2]),
                                           std::stoll((*it)[3]));
  }
  return out;
}

class MnistChaosTest : public ::testing::Test {
 protected:
  MnistChaosTest() : server_(dir_), agents_(kNodes) {}

  // Starts (or starts again) the agent of node `node` for job `run_id`.
  void StartAgent(const std::string& run_id, int node) {
    SubprocessOptions options;
    options.argv = {
        Ddprun(), "--rdzv-endpoint", server_.endpoint(), "--rdzv-id", run_id,
        "--nnodes", absl::StrCat(kNodes), "--nproc-per-node",
        absl::StrCat(kPerNode), "--node-rank", absl::StrCat(node),
        "--max-restarts", absl::StrCat(kMaxRestarts), "--monitor-interval",
        // The other node's workers wait for a killed agent's longer than
        // the server takes to drop its node (a second after its heartbeat
        // stream broke), so that the loss, not a hang, ends the round.
        "0.05", "--worker-timeout", "5", "--shutdown-grace", "2",
        // A heartbeat timeout longer than the server is down; is_host=0:
        // the agents never serve the endpoint themselves.
        "--rdzv-conf",
        "heartbeat_interval=0.2,heartbeat_timeout=20,last_call_timeout=1,"
        "is_host=0",
        Mnist(), "--data-dir", MnistDir(), "--epochs", absl::StrCat(kEpochs),
        "--train-limit", absl::StrCat(kTrainSamples), "--seed", "7",
        "--summary-json", dir_.File(run_id + ".json"), "--save", "",
        "--checkpoint-dir", CheckpointDir(run_id), "--checkpoint-every",
        absl::StrCat(kCheckpointEvery), "--no-progress"};
    const std::string name =
        absl::StrCat(run_id, ".agent", node, ".", log_paths_.size());
    options.stdout_path = dir_.File(name + ".out");
    options.stderr_path = dir_.File(name + ".err");
    log_paths_.push_back(options.stderr_path);
    absl::StatusOr<Subprocess> agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents_[node] = std::make_unique<Subprocess>(*std::move(agent));
  }

  std::string CheckpointDir(const std::string& run_id) const {
    return dir_.File(run_id + ".ckpt");
  }
  int64_t NewestStep(const std::string& run_id) const {
    return NewestCheckpointStep(CheckpointDir(run_id)).value_or(0);
  }

  // Every agent's stderr (its workers' lines included), every start.
  std::string AgentLogs() const {
    std::string out;
    for (const std::string& path : log_paths_) {
      absl::StrAppend(&out, "--- ", path, ":\n", ReadFileOrEmpty(path));
    }
    return out;
  }
  std::string Logs() const {
    return absl::StrCat(AgentLogs(), "--- rendezvous:\n", server_.log());
  }

  // Node `node`'s workers by local rank, once it has all of them.
  std::map<int, pid_t> WorkersOf(int node) {
    std::map<int, pid_t> workers;
    const std::string logs = AgentLogs();
    for (pid_t pid : Workers(agents_[node]->pid())) {
      const int rank = RankOf(pid, logs);
      if (rank >= 0) workers[rank - node * kPerNode] = pid;
    }
    return workers;
  }
  bool WaitForAllWorkers() {
    return WaitFor(
        [&] {
          for (int node = 0; node < kNodes; ++node) {
            std::map<int, pid_t> workers = WorkersOf(node);
            if (static_cast<int>(workers.size()) != kPerNode ||
                workers.begin()->first != 0 ||
                workers.rbegin()->first != kPerNode - 1) {
              return false;
            }
          }
          return true;
        },
        kRecoveryBound, absl::Milliseconds(20));
  }

  // Both agents end; true when both succeeded.
  void WaitForAgents() {
    for (int node = 0; node < kNodes; ++node) {
      std::optional<ExitInfo> exit = agents_[node]->Wait(kJobBound);
      ASSERT_TRUE(exit.has_value()) << "node " << node << " never ended\n"
                                    << Logs();
      ASSERT_TRUE(exit->ok())
          << "node " << node << ": " << exit->ToString() << "\n"
          << Logs();
    }
  }

  TempDir dir_;
  RendezvousProcess server_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
  std::vector<std::string> log_paths_;
};

TEST_F(MnistChaosTest, SeededFaultsOfEveryKindAreRecovered) {
  const uint32_t seed = ChaosSeed();
  const std::vector<PlannedFault> plan = Plan(seed);
  const std::string described = Describe(plan, seed);
  std::cerr << described << "\n";
  SCOPED_TRACE(described);
  ASSERT_TRUE(server_.Start(0)) << server_.log();

  // The fault-free run: the same command and seed.
  for (int node = 0; node < kNodes; ++node) StartAgent("reference", node);
  WaitForAgents();
  if (HasFatalFailure()) return;
  const std::string reference = ReadFileOrEmpty(dir_.File("reference.json"));
  ASSERT_FALSE(reference.empty()) << Logs();
  EXPECT_EQ(SummaryList(reference, "epoch_samples"),
            std::vector<int64_t>(kEpochs, kTrainSamples))
      << reference;

  const std::string job = "chaos";
  for (int node = 0; node < kNodes; ++node) StartAgent(job, node);
  ASSERT_TRUE(server_.WaitForRunning(job, 0, 0, kNodes, kRecoveryBound))
      << Logs();
  ASSERT_TRUE(WaitForAllWorkers()) << Logs();

  int64_t round = 0;
  int restarts = 0;
  int64_t recovered_at = 0;     // the step of the last recovery
  int in_place_recoveries = 0;  // faults that needed a new round
  for (const PlannedFault& fault : plan) {
    SCOPED_TRACE(FaultName(fault.kind));
    // The trigger: training reached the planned step.
    ASSERT_TRUE(WaitFor(
        [&] { return NewestStep(job) >= recovered_at + fault.after_steps; },
        kRecoveryBound, absl::Milliseconds(10)))
        << "training stalled before step " << recovered_at + fault.after_steps
        << "\n"
        << Logs();
    std::map<int, std::map<int, pid_t>> before;
    for (int node = 0; node < kNodes; ++node) before[node] = WorkersOf(node);
    const int64_t at_step = NewestStep(job);
    const bool worker_fault =
        fault.kind == Fault::kWorkerKill || fault.kind == Fault::kWorkerHang;
    pid_t victim = -1;
    switch (fault.kind) {
      case Fault::kWorkerKill:
      case Fault::kWorkerHang:
        ASSERT_EQ(before[fault.node].size(), static_cast<size_t>(kPerNode))
            << Logs();
        victim = before[fault.node].at(fault.local_rank);
        ASSERT_EQ(
            kill(victim, fault.kind == Fault::kWorkerKill ? SIGKILL : SIGSTOP),
            0);
        break;
      case Fault::kAgentKill: {
        agents_[fault.node]->Signal(SIGKILL);
        std::optional<ExitInfo> exit =
            agents_[fault.node]->Wait(absl::Seconds(30));
        ASSERT_TRUE(exit.has_value() && exit->signal == SIGKILL) << Logs();
        StartAgent(job, fault.node);
        break;
      }
      case Fault::kServerKill: {
        // What the server knew just before it died.
        std::optional<v1::JobStatus> status = server_.Job(job);
        ASSERT_TRUE(status.has_value()) << Logs();
        ASSERT_EQ(status->round(), round) << Logs();
        ASSERT_EQ(status->restart_count(), restarts) << Logs();
        const int port = server_.port();
        ASSERT_TRUE(server_.KillNine());
        ASSERT_TRUE(server_.Start(port)) << server_.log();
        break;
      }
    }
    round += NewRounds(fault.kind);
    in_place_recoveries += NewRounds(fault.kind);
    restarts += NewRestarts(fault.kind);
    // The restarted server learns the job back: the same round and restart
    // count, not 0; after any other fault the round and count that fault
    // took.
    ASSERT_TRUE(
        server_.WaitForRunning(job, round, restarts, kNodes, kRecoveryBound))
        << "expected round " << round << ", restart count " << restarts << "\n"
        << Logs();
    ASSERT_TRUE(WaitForAllWorkers()) << Logs();
    std::map<int, std::map<int, pid_t>> after;
    for (int node = 0; node < kNodes; ++node) after[node] = WorkersOf(node);
    if (worker_fault) {
      // Only the victim was replaced: the other node's workers and the
      // victim's node-mates are the same processes.
      const int other = 1 - fault.node;
      EXPECT_EQ(after[other], before[other])
          << "a worker of node " << other << ", which no fault touched, was "
          << "restarted\n"
          << Logs();
      for (const auto& [local_rank, pid] : before[fault.node]) {
        if (local_rank == fault.local_rank) {
          EXPECT_NE(after[fault.node].at(local_rank), pid);
          // (Killed by its agent, a stopped victim may take a moment to
          // go.)
          EXPECT_TRUE(
              WaitFor([&] { return ProcessGone(victim); }, absl::Seconds(30)))
              << victim;
        } else {
          EXPECT_EQ(after[fault.node].at(local_rank), pid)
              << "node-mate of the victim restarted\n"
              << Logs();
        }
      }
    } else if (fault.kind == Fault::kServerKill) {
      EXPECT_EQ(after, before) << "a worker restarted because the server "
                               << "did\n"
                               << Logs();
    }
    // Training goes on past the fault.
    ASSERT_TRUE(WaitFor([&] { return NewestStep(job) > at_step; },
                        kRecoveryBound, absl::Milliseconds(10)))
        << "no step after the fault\n"
        << Logs();
    recovered_at = NewestStep(job);
  }

  WaitForAgents();
  if (HasFatalFailure()) return;
  const std::string logs = AgentLogs();

  // The job completed, and its restart count is the faults' new rounds.
  std::optional<v1::JobStatus> status = server_.Job(job);
  ASSERT_TRUE(status.has_value()) << Logs();
  EXPECT_EQ(status->state(), v1::JOB_STATE_SUCCEEDED) << Logs();
  EXPECT_EQ(status->restart_count(), restarts) << Logs();
  EXPECT_EQ(status->round(), round) << Logs();
  EXPECT_EQ(restarts, 2);  // a worker kill and a hang; a lost node is none
  EXPECT_THAT(logs, ::testing::HasSubstr(
                        absl::StrCat("restart ", restarts, "/", kMaxRestarts)));
  EXPECT_THAT(logs, ::testing::Not(::testing::HasSubstr(absl::StrCat(
                        "restart ", restarts + 1, "/", kMaxRestarts))));

  // In-place recoveries lose no step: the survivors of each such round
  // resume at the last step every one of them completed.
  for (const auto& [resumed_round, survivors] : InPlaceResumes(logs)) {
    int64_t last_completed = 0;
    for (const auto& [stopped, resumed] : survivors) {
      last_completed = std::max(last_completed, stopped);
    }
    for (const auto& [stopped, resumed] : survivors) {
      EXPECT_EQ(resumed, last_completed)
          << "round " << resumed_round << " lost steps\n"
          << logs;
    }
  }

  const std::string summary = ReadFileOrEmpty(dir_.File(job + ".json"));
  ASSERT_FALSE(summary.empty()) << Logs();
  EXPECT_EQ(SummaryNumber(summary, "world_size"), kNodes * kPerNode);
  // Exact sample accounting: every epoch adds up to the data set, through
  // in-place recoveries and the resume from a checkpoint alike.
  EXPECT_EQ(SummaryNumber(summary, "epoch_size"), kTrainSamples);
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(kEpochs, kTrainSamples))
      << summary;
  EXPECT_EQ(SummaryNumber(summary, "steps"), SummaryNumber(reference, "steps"));
  // Every fault that needed a round was recovered in place, the agent kill
  // too: the other node's workers kept their state and handed it to the
  // restarted agent's, so nothing resumed from a checkpoint.
  std::optional<double> resumed_from =
      SummaryNumber(summary, "resumed_from_step");
  EXPECT_TRUE(!resumed_from.has_value() || *resumed_from < 0) << summary;
  EXPECT_EQ(SummaryList(summary, "resumed_at_steps").size(),
            static_cast<size_t>(in_place_recoveries))
      << summary;
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  std::optional<double> expected = SummaryNumber(reference, "test_accuracy");
  ASSERT_TRUE(accuracy.has_value() && expected.has_value()) << summary;
  EXPECT_GE(*accuracy, 0.85);
  EXPECT_NEAR(*accuracy, *expected, kAccuracyTolerance);
}

}  // namespace
}  // namespace ddprun::testing
