// Faults with the real trainer: ddprun-mnist on real MNIST,
// something breaks mid-training, and the job still finishes with a good
// accuracy, resuming from its checkpoint. Before each fault the workers are
// frozen (SIGSTOP), so that the test knows the newest checkpoint and checks
// that the job resumed from exactly that step: one epoch from scratch also
// passes the accuracy floor, a resume from random weights would not pass
// that check. Registered only in builds that have ddprun-mnist (it needs
// LibTorch).
#include <dirent.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// Several epochs over this slice reach well above kMinAccuracy (so does
// one: ExpectResumedFrom is the check of the resume).
constexpr int kTrainSamples = 20000;
constexpr int kEpochs = 4;
constexpr double kMinAccuracy = 0.85;

std::vector<std::string> MnistArgs(const TempDir& dir) {
  return {Mnist(), "--epochs", std::to_string(kEpochs), "--data-dir",
          MnistDir(), "--train-limit", std::to_string(kTrainSamples),
          "--checkpoint-dir", dir.File("checkpoints"), "--checkpoint-every",
          "20", "--summary-json", dir.File("summary.json"), "--save",
          dir.File("model.pt"),
          // These tests are of restarts from a checkpoint (in-place
          // recovery: mnist_inplace_test.cc).
          "--no-in-place"};
}

// A complete checkpoint (not only the temporary file of the first).
bool HasCheckpoint(const TempDir& dir) {
  return NewestCheckpointStep(dir.File("checkpoints")).has_value();
}

void ExpectTrained(const TempDir& dir, int world_size) {
  ExpectTrainedSummary(dir.File("summary.json"), world_size, kMinAccuracy);
}

// Freezes `workers` and returns the newest checkpoint's step: the one the
// job must resume from. -1 (and a failure) when there is none.
int64_t FreezeAndReadResumeStep(const TempDir& dir,
                                const std::vector<pid_t>& workers) {
  EXPECT_TRUE(FreezeProcesses(workers));
  std::optional<int64_t> step = NewestCheckpointStep(dir.File("checkpoints"));
  EXPECT_TRUE(step.has_value()) << "no checkpoint";
  return step.value_or(-1);
}

struct Job {
  Subprocess agent;
  std::string err_path;
  std::string err() const { return ReadFileOrEmpty(err_path); }
};

Job StartJob(const TempDir& dir, const std::vector<std::string>& flags,
             const std::string& name = "agent") {
  SubprocessOptions options;
  // --no-prewarm: these tests count the agent's children, and the
  // default's zygote looks like a worker for its first half second.
  options.argv =
      Concat(Concat({Ddprun(), "--no-prewarm"}, flags), MnistArgs(dir));
  options.stderr_path = dir.File(name + ".err");
  options.stdout_path = dir.File(name + ".out");
  auto agent = Subprocess::Start(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return Job{std::move(*agent), options.stderr_path};
}

TEST(MnistFaultTest, KillNineOfAWorkerMidEpochResumesAndFinishes) {
  TempDir dir;
  Job job = StartJob(dir, {"--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "2", "--monitor-interval", "0.1",
                           // The test freezes the workers (SIGSTOP) to
                           // read the checkpoint they resume from.
                           "--hang-bound", "stopped=0"});
  ASSERT_TRUE(WaitFor([&] { return HasCheckpoint(dir); }, absl::Minutes(2)))
      << job.err();
  std::vector<pid_t> workers = Workers(job.agent.pid());
  ASSERT_EQ(workers.size(), 2u) << job.err();
  const int64_t resume_step = FreezeAndReadResumeStep(dir, workers);
  ASSERT_EQ(kill(workers.back(), SIGKILL), 0);
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr("signal SIGKILL"));
  EXPECT_THAT(job.err(), HasSubstr("restart 1/2"));
  ExpectTrained(dir, 2);
  ExpectResumedFrom(dir.File("summary.json"), resume_step);
}

TEST(MnistFaultTest, AHungWorkerIsDetectedAndTheJobFinishes) {
  TempDir dir;
  Job job = StartJob(dir, {"--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "2", "--monitor-interval", "0.1",
                           // The test freezes the workers (SIGSTOP) to
                           // read the checkpoint they resume from.
                           "--hang-bound", "stopped=0", "--worker-timeout", "2",
                           "--shutdown-grace", "1"});
  ASSERT_TRUE(WaitFor([&] { return HasCheckpoint(dir); }, absl::Minutes(2)))
      << job.err();
  std::vector<pid_t> workers = Workers(job.agent.pid());
  ASSERT_EQ(workers.size(), 2u) << job.err();
  // Stopped processes make no progress and do not die: a hang.
  const int64_t resume_step = FreezeAndReadResumeStep(dir, workers);
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr("hung"));
  ExpectTrained(dir, 2);
  ExpectResumedFrom(dir.File("summary.json"), resume_step);
}

TEST(MnistFaultTest, AWorkerThatAlwaysFailsEndsTheJobWithASummary) {
  TempDir dir;
  SubprocessOptions options;
  options.argv = {Ddprun(), "--standalone", "--max-restarts", "1",
                  Mnist(),  "--data-dir",   dir.File("none"), "--epochs",
                  "1"};
  options.stderr_path = dir.File("agent.err");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok());
  std::optional<ExitInfo> exit = agent->Wait(absl::Minutes(2));
  ASSERT_TRUE(exit.has_value());
  std::string err = ReadFileOrEmpty(dir.File("agent.err"));
  EXPECT_EQ(exit->exit_code, 1) << err;
  EXPECT_THAT(err, HasSubstr("first failure (root cause)"));
  EXPECT_THAT(err, HasSubstr("rank 0 (local rank 0)"));
  EXPECT_THAT(err, HasSubstr("restart 1/1"));  // it was restarted once
}

TEST(MnistFaultTest, TheSurvivorOfAKilledAgentFinishesAlone) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  std::vector<std::string> flags = {
      "--nnodes",
      "1:2",
      "--nproc-per-node",
      "1",
      "--rdzv-endpoint",
      (*server)->endpoint(),
      "--rdzv-id",
      "mnist-survivor",
      "--monitor-interval",
      "0.1",
      "--max-restarts",
      "2",
      "--rdzv-conf",
      "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=1"};
  Job survivor = StartJob(dir, Concat(flags, {"--node-rank", "0"}), "agent0");
  Job victim = StartJob(dir, Concat(flags, {"--node-rank", "1"}), "agent1");
  ASSERT_TRUE(WaitFor([&] { return HasCheckpoint(dir); }, absl::Minutes(2)))
      << survivor.err() << victim.err();
  std::vector<pid_t> orphans = Workers(victim.agent.pid());
  std::vector<pid_t> workers = Workers(survivor.agent.pid());
  workers.insert(workers.end(), orphans.begin(), orphans.end());
  ASSERT_EQ(workers.size(), 2u) << survivor.err() << victim.err();
  const int64_t resume_step = FreezeAndReadResumeStep(dir, workers);
  victim.agent.Signal(SIGKILL);
  ASSERT_TRUE(victim.agent.Wait(absl::Seconds(10)).has_value());
  EXPECT_TRUE(WaitFor(
      [&] {
        for (pid_t pid : orphans) {
          if (!ProcessGone(pid)) return false;
        }
        return true;
      },
      absl::Seconds(1)));
  std::optional<ExitInfo> exit = survivor.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << survivor.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << survivor.err();
  ExpectTrained(dir, 1);
  ExpectResumedFrom(dir.File("summary.json"), resume_step);
}

TEST(MnistFaultTest, AThirdAgentJoiningScalesTheJobUp) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  // The test freezes the workers (SIGSTOP) to read the checkpoint they
  // resume from: --hang-bound stopped=0, or a stopped worker found hung
  // before the third node joins spends the job's only restart (CI, loaded).
  std::vector<std::string> flags = {
      "--nnodes",           "2:3",
      "--nproc-per-node",   "1",
      "--rdzv-endpoint",    (*server)->endpoint(),
      "--rdzv-id",          "mnist-scale-up",
      "--monitor-interval", "0.1",
      "--hang-bound",       "stopped=0",
      "--rdzv-conf",        "heartbeat_interval=0.2,last_call_timeout=0.5"};
  std::vector<Job> jobs;
  jobs.push_back(StartJob(dir, Concat(flags, {"--node-rank", "0"}), "agent0"));
  jobs.push_back(StartJob(dir, flags, "agent1"));
  ASSERT_TRUE(WaitFor([&] { return HasCheckpoint(dir); }, absl::Minutes(2)))
      << jobs[0].err() << jobs[1].err();
  std::vector<pid_t> workers = Workers(jobs[0].agent.pid());
  for (pid_t pid : Workers(jobs[1].agent.pid())) workers.push_back(pid);
  ASSERT_EQ(workers.size(), 2u) << jobs[0].err() << jobs[1].err();
  const int64_t resume_step = FreezeAndReadResumeStep(dir, workers);
  jobs.push_back(StartJob(dir, flags, "agent2"));
  for (Job& job : jobs) {
    std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(exit.has_value()) << job.err();
    EXPECT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  }
  // The new node joined a new round; membership changes cost no restart.
  EXPECT_THAT(jobs[0].err(), HasSubstr("of 3, ranks 0..0 of 3"));
  EXPECT_THAT(jobs[0].err(), HasSubstr("restart 0/0"));
  ExpectTrained(dir, 3);
  ExpectResumedFrom(dir.File("summary.json"), resume_step);
}

}  // namespace
}  // namespace ddprun::testing
