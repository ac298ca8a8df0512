// In-place recovery with the real trainer: ddprun-mnist on real
// MNIST, one worker is killed (kill -9) mid-training, and the survivors are
// not restarted: they keep their pids, the agent replaces only the lost
// worker, the new member takes the state of a survivor over the new group,
// and training goes on from the last step completed on every rank. There
// is no --checkpoint-dir, so a restart of everything would start from step
// 0 and fail these checks. Registered only in builds that have
// ddprun-mnist (it needs LibTorch).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/proc_stat.h"
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
using ::testing::Not;

// Divisible by 2 and 3 and by the per-step batch of either world, so that
// every epoch is exactly this many samples (no padding).
constexpr int kTrainSamples = 12000;
constexpr int kEpochs = 4;
constexpr double kMinAccuracy = 0.85;
// Within half a point of the fault-free run with the same seed: recovery
// may reorder a few sums, never lose or repeat samples.
constexpr double kAccuracyTolerance = 0.005;

std::vector<std::string> MnistArgs(const TempDir& dir,
                                   const std::string& summary) {
  return {Mnist(),
          "--epochs",
          std::to_string(kEpochs),
          "--data-dir",
          MnistDir(),
          "--train-limit",
          std::to_string(kTrainSamples),
          "--seed",
          "7",
          "--summary-json",
          dir.File(summary),
          "--save",
          dir.File(summary + ".pt"),
          "--no-progress"};
}

// The args of a run of `samples` training samples, `epochs` epochs, its
// summary at `summary` (no model saved).
std::vector<std::string> SmallMnistArgs(const TempDir& dir,
                                        const std::string& summary, int samples,
                                        int epochs) {
  return {Mnist(),    "--epochs",       std::to_string(epochs),  "--data-dir",
          MnistDir(), "--train-limit",  std::to_string(samples), "--seed",
          "7",        "--summary-json", dir.File(summary),       "--save",
          "",         "--no-progress"};
}

// Runs `argv` to its end (bounded); its stderr.
std::string RunToSuccess(const TempDir& dir,
                         const std::vector<std::string>& argv,
                         const std::string& name) {
  SubprocessOptions options;
  options.argv = argv;
  options.stderr_path = dir.File(name + ".err");
  options.stdout_path = dir.File(name + ".out");
  auto process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return "";
  std::optional<ExitInfo> exit = process->Wait(absl::Minutes(3));
  const std::string err = ReadFileOrEmpty(options.stderr_path);
  EXPECT_TRUE(exit.has_value() && exit->ok())
      << (exit ? exit->ToString() : "still running") << "\n"
      << err;
  return err;
}

// The workers of the agent `agent`: the one of global rank `rank` (-1 when
// none is) and the others.
struct VictimAndOthers {
  pid_t victim = -1;
  std::set<pid_t> others;
};
VictimAndOthers SplitAt(pid_t agent, int rank) {
  VictimAndOthers workers;
  for (pid_t pid : Workers(agent)) {
    if (RankOf(pid) == rank) {
      workers.victim = pid;
    } else {
      workers.others.insert(pid);
    }
  }
  return workers;
}

// Whether `pid` has a handler for `signal` (/proc/PID/status, SigCgt).
bool CatchesSignal(pid_t pid, int signal) {
  const std::string status =
      ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/status"));
  const size_t at = status.find("SigCgt:");
  if (at == std::string::npos) return false;
  const uint64_t mask =
      std::strtoull(status.c_str() + at + 7, nullptr, /*base=*/16);
  return (mask >> (signal - 1)) & 1;
}

// Each of `kept` is still a worker of `agent`: it was not restarted.
void ExpectStillWorkers(pid_t agent, const std::set<pid_t>& kept,
                        const std::string& log) {
  std::vector<pid_t> now = Workers(agent);
  for (pid_t pid : kept) {
    EXPECT_NE(std::find(now.begin(), now.end(), pid), now.end())
        << "worker " << pid << " was restarted\n"
        << log;
  }
}

struct Job {
  Subprocess agent;
  std::string err_path;
  std::string err() const { return ReadFileOrEmpty(err_path); }
};

// The tests look at the agent's children, so they run without prewarming
// (--no-prewarm) unless they are about it: the default's zygote is a child
// of the agent that looks like a worker until its static initialisers name
// it "ddprun-zygote" (half a second of LibTorch loading in). The default's
// own path: MnistInPlacePrewarmTest's ByDefault case and the fault harness.
enum class Prewarm { kOff, kAsFlagsSay };

Job StartJob(const TempDir& dir, const std::vector<std::string>& flags,
             const std::string& name, const std::string& summary,
             Prewarm prewarm = Prewarm::kOff,
             const std::vector<std::string>& mnist_flags = {}) {
  SubprocessOptions options;
  options.argv = Concat(
      Concat({Ddprun()}, flags),
      Concat(prewarm == Prewarm::kOff ? std::vector<std::string>{"--no-prewarm"}
                                      : std::vector<std::string>{},
             Concat(MnistArgs(dir, summary), mnist_flags)));
  options.stderr_path = dir.File(name + ".err");
  options.stdout_path = dir.File(name + ".out");
  auto agent = Subprocess::Start(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return Job{std::move(*agent), options.stderr_path};
}

// The workers of `agent` by their RANK: Workers() also counts a zygote in
// its first half second, before it names itself.
std::vector<pid_t> RankedWorkers(pid_t agent) {
  std::vector<pid_t> workers;
  for (pid_t pid : Children(agent)) {
    if (RankOf(pid) >= 0) workers.push_back(pid);
  }
  return workers;
}

// The standbys of `agent` ready for a round: children without a RANK,
// not the zygote, blocked on their pipe.
int WaitingStandbys(pid_t agent) {
  int waiting = 0;
  for (pid_t pid : Children(agent)) {
    if (RankOf(pid) < 0 &&
        ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/comm")) !=
            "ddprun-zygote\n" &&
        absl::EndsWith(ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/wchan")),
                       "pipe_read")) {
      ++waiting;
    }
  }
  return waiting;
}

// The steps the survivors had completed when they stopped for the new
// round, from their log lines ("stopped at step N, resuming at step M").
std::vector<std::pair<int64_t, int64_t>> StoppedAndResumed(
    const std::string& log) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::regex re("stopped at step ([0-9]+), resuming at step ([0-9]+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re);
       it != std::sregex_iterator(); ++it) {
    out.emplace_back(std::stoll((*it)[1]), std::stoll((*it)[2]));
  }
  return out;
}

// The fault-free run: same command, same seed.
std::string RunFaultFree(const TempDir& dir,
                         const std::vector<std::string>& flags,
                         Prewarm prewarm = Prewarm::kOff) {
  Job job = StartJob(dir, flags, "reference", "reference.json", prewarm);
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  EXPECT_TRUE(exit.has_value() && exit->ok()) << job.err();
  return ReadFileOrEmpty(dir.File("reference.json"));
}

// The checks every in-place test makes of the faulty run's summary against
// the fault-free one's.
void ExpectExactInPlaceRun(const std::string& summary,
                           const std::string& reference, const std::string& log,
                           int world_size, int epochs = kEpochs) {
  ASSERT_FALSE(summary.empty()) << log;
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(SummaryNumber(summary, "world_size"), world_size);
  // One in-place recovery, resumed at the last step every survivor
  // completed: no step lost.
  std::vector<int64_t> resumed = SummaryList(summary, "resumed_at_steps");
  ASSERT_EQ(resumed.size(), 1u) << summary << log;
  std::vector<std::pair<int64_t, int64_t>> survivors = StoppedAndResumed(log);
  ASSERT_EQ(survivors.size(), static_cast<size_t>(world_size - 1)) << log;
  int64_t last_completed = 0;
  for (const auto& [stopped, resumed_at] : survivors) {
    last_completed = std::max(last_completed, stopped);
    EXPECT_EQ(resumed_at, resumed[0]);
  }
  EXPECT_GT(resumed[0], 0) << "the job started over";
  EXPECT_EQ(resumed[0], last_completed) << "steps lost";
  // Exact sample accounting: every epoch adds up to the data set.
  EXPECT_EQ(SummaryNumber(summary, "epoch_size"), kTrainSamples);
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(epochs, kTrainSamples))
      << summary;
  EXPECT_EQ(SummaryNumber(summary, "steps"), SummaryNumber(reference, "steps"));
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  std::optional<double> expected = SummaryNumber(reference, "test_accuracy");
  ASSERT_TRUE(accuracy.has_value() && expected.has_value());
  EXPECT_GE(*accuracy, kMinAccuracy);
  EXPECT_NEAR(*accuracy, *expected, kAccuracyTolerance);
}

class MnistInPlaceTest : public ::testing::TestWithParam<int> {};

TEST_P(MnistInPlaceTest, KillNineOfOneWorkerKeepsTheSurvivorsRunning) {
  const int nproc = GetParam();
  // With three workers the lead (rank 0, which writes the summary) is the
  // one killed: its replacement must carry the accounting on.
  const int victim_rank = nproc == 3 ? 0 : nproc - 1;
  TempDir dir;
  const std::vector<std::string> flags = {"--standalone",
                                          "--nproc-per-node",
                                          std::to_string(nproc),
                                          "--max-restarts",
                                          "3",
                                          "--monitor-interval",
                                          "0.05"};
  const std::string reference = RunFaultFree(dir, flags);

  Job job = StartJob(dir, flags, "agent", "summary.json");
  // Mid-training: after the first epoch's line.
  ASSERT_TRUE(
      WaitFor([&] { return job.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << job.err();
  VictimAndOthers workers = SplitAt(job.agent.pid(), victim_rank);
  ASSERT_EQ(workers.others.size() + 1, static_cast<size_t>(nproc)) << job.err();
  ASSERT_GT(workers.victim, 0);
  ASSERT_EQ(kill(workers.victim, SIGKILL), 0);
  // The survivors are still the same processes once the job goes on.
  ASSERT_TRUE(WaitFor(
      [&] { return job.err().find("resuming at step") != std::string::npos; },
      absl::Minutes(2)))
      << job.err();
  ExpectStillWorkers(job.agent.pid(), workers.others, job.err());
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr("signal SIGKILL"));
  EXPECT_THAT(job.err(), HasSubstr("recovering in place"));
  EXPECT_THAT(job.err(), HasSubstr("restart 1/3"));
  ExpectExactInPlaceRun(ReadFileOrEmpty(dir.File("summary.json")), reference,
                        job.err(), nproc);
}

INSTANTIATE_TEST_SUITE_P(Workers, MnistInPlaceTest, ::testing::Values(2, 3));

// The lost rank is replaced by a waiting standby, which takes the
// survivor's state as any new member does: by default (ddprun-mnist says
// it waits for its round, so the agent starts prewarming then), and with
// --prewarm (from the start).
class MnistInPlacePrewarmTest : public ::testing::TestWithParam<bool> {};

TEST_P(MnistInPlacePrewarmTest, AKilledWorkerIsReplacedByAStandbyInPlace) {
  TempDir dir;
  const bool asked = GetParam();
  std::vector<std::string> flags = {
      "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
      "--monitor-interval", "0.05",
      // The workers are held (SIGSTOP) while the standbys get ready, as
      // long as that takes: neither stopped nor silent is a hang here
      // (CI, loaded: held past the step bound's 10 s).
      "--hang-bound", "stopped=0,step=0"};
  if (asked) flags.push_back("--prewarm");
  const std::string reference = RunFaultFree(dir, flags, Prewarm::kAsFlagsSay);

  Job job = StartJob(dir, flags, "agent", "summary.json", Prewarm::kAsFlagsSay);
  // Training runs; the workers are held (SIGSTOP) until the standbys wait,
  // forked by the node's zygote (children without a RANK, blocked on their
  // pipe), so that the short job cannot end first: the zygote starts only
  // now, on the CPU the training leaves.
  ASSERT_TRUE(
      WaitFor([&] { return job.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << job.err();
  std::vector<pid_t> workers = RankedWorkers(job.agent.pid());
  ASSERT_EQ(workers.size(), 2u) << job.err();
  ASSERT_TRUE(FreezeProcesses(workers));
  const bool standbys_wait = WaitFor(
      [&] { return WaitingStandbys(job.agent.pid()) == 2; }, absl::Minutes(2));
  for (pid_t pid : workers) kill(pid, SIGCONT);
  ASSERT_TRUE(standbys_wait) << job.err();
  pid_t victim = -1;
  pid_t survivor = -1;
  for (pid_t pid : Children(job.agent.pid())) {
    if (RankOf(pid) == 1) victim = pid;
    if (RankOf(pid) == 0) survivor = pid;
  }
  ASSERT_GT(victim, 0);
  ASSERT_GT(survivor, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] { return job.err().find("resuming at step") != std::string::npos; },
      absl::Minutes(2)))
      << job.err();
  std::vector<pid_t> after = Workers(job.agent.pid());
  EXPECT_NE(std::find(after.begin(), after.end(), survivor), after.end())
      << job.err();
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr("replaced by a prewarmed worker"));
  // The fast path: the standby was forked by the zygote, not exec'd, and
  // the agent never fell back to exec.
  EXPECT_THAT(job.err(), HasSubstr("prewarmed workers fork from a zygote"));
  EXPECT_THAT(job.err(), HasSubstr("(forked by the zygote, pid"));
  EXPECT_THAT(job.err(), Not(HasSubstr("start by exec from now on")));
  // By default a worker forked the zygote; asked, ddprun started it.
  EXPECT_EQ(job.err().find("that a worker forked") != std::string::npos, !asked)
      << job.err();
  ExpectExactInPlaceRun(ReadFileOrEmpty(dir.File("summary.json")), reference,
                        job.err(), 2);
}

INSTANTIATE_TEST_SUITE_P(ByDefaultAndAsked, MnistInPlacePrewarmTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Asked" : "ByDefault";
                         });

// The CPU time `pid` used (user and system), in seconds; -1 when unknown.
double CpuSeconds(pid_t pid) {
  // utime and stime: fields 14 and 15.
  std::vector<std::string> fields = common::ReadProcStatFields(pid);
  int64_t user = 0;
  int64_t system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[14 - 3], &user) ||
      !absl::SimpleAtoi(fields[15 - 3], &system)) {
    return -1;
  }
  return static_cast<double>(user + system) / sysconf(_SC_CLK_TCK);
}

// The default prewarming costs no process start: the first workers' local
// rank 0 forks the node's zygote where its program waits for its round
// (DDPRUN_ZYGOTE_SEED_FD), so that even the job's first fault, seconds
// into it, is replaced by a forked standby. The agent is held to one CPU,
// so that two workers fill it wherever the test runs (where a zygote of its
// own would take from the training). Checked from /proc, not the log
// alone: the zygote is the agent's child in a process group of its own, and
// used almost no CPU (a process start of ddprun-mnist is ~0.5 CPU-s).
// The first fault kills either local rank 1 or the worker that forked the
// zygote (local rank 0): the agent adopted the zygote, which outlives the
// worker it came from and forks that worker's replacement too.
class MnistInPlaceZygoteTest : public ::testing::TestWithParam<int> {};

TEST_P(MnistInPlaceZygoteTest,
       TheFirstWorkersForkTheZygoteAndTheFirstFaultUsesIt) {
  const int victim_rank = GetParam();
  TempDir dir;
  SubprocessOptions options;
  options.argv = Concat(
      {"taskset", "-c", "0", Ddprun(), "--standalone", "--nproc-per-node", "2",
       "--max-restarts", "3", "--monitor-interval", "0.05",
       // The workers are held (SIGSTOP) while the standbys get ready.
       "--hang-bound", "stopped=0,step=0"},
      MnistArgs(dir, "summary.json"));
  options.stderr_path = dir.File("agent.err");
  options.stdout_path = dir.File("agent.out");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto err = [&] { return ReadFileOrEmpty(options.stderr_path); };
  // `taskset` execs ddprun: the agent keeps its pid.
  pid_t zygote = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (pid_t pid : Children(agent->pid())) {
          if (ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/comm")) ==
              "ddprun-zygote\n") {
            zygote = pid;
          }
        }
        return zygote > 0 && err().find("training mlp") != std::string::npos;
      },
      absl::Minutes(2)))
      << err();
  // The short job is held until the zygote's standbys wait.
  std::vector<pid_t> workers = RankedWorkers(agent->pid());
  ASSERT_EQ(workers.size(), 2u) << err();
  ASSERT_TRUE(FreezeProcesses(workers));
  const bool standbys_wait = WaitFor(
      [&] { return WaitingStandbys(agent->pid()) == 2; }, absl::Minutes(2));
  const pid_t zygote_group = getpgid(zygote);
  const double zygote_cpu = CpuSeconds(zygote);
  const double worker_cpu = CpuSeconds(workers[0]);
  ThawProcesses(workers);
  ASSERT_TRUE(standbys_wait) << err();
  EXPECT_EQ(zygote_group, zygote);
  EXPECT_GE(zygote_cpu, 0);
  EXPECT_LT(zygote_cpu, 0.2) << "worker: " << worker_cpu << " CPU-s";
  EXPECT_THAT(err(), HasSubstr("that a worker forked"));
  // The first fault, before any other.
  VictimAndOthers first = SplitAt(agent->pid(), victim_rank);
  ASSERT_GT(first.victim, 0) << err();
  ASSERT_EQ(kill(first.victim, SIGKILL), 0);
  std::optional<ExitInfo> exit = agent->Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << err();
  const std::string log = err();
  EXPECT_THAT(log, HasSubstr("replaced by a prewarmed worker")) << log;
  // By the zygote found above: it lived on, and no other was seeded.
  EXPECT_THAT(
      log, HasSubstr(absl::StrCat("(forked by the zygote, pid ", zygote, ")")))
      << log;
  EXPECT_EQ(CountLinesWith(log, "that a worker forked"), 1) << log;
  EXPECT_THAT(log, Not(HasSubstr("started anew"))) << log;
  EXPECT_EQ(
      SummaryList(ReadFileOrEmpty(dir.File("summary.json")), "epoch_samples"),
      std::vector<int64_t>(kEpochs, kTrainSamples))
      << log;
}

INSTANTIATE_TEST_SUITE_P(Victims, MnistInPlaceZygoteTest,
                         ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? "TheSeedingWorker"
                                                  : "ItsPeer";
                         });

// A hang: one of three workers is stopped (SIGSTOP). Its peers go silent
// with it (they wait for it in the allreduce); the agent tells them apart,
// kills and replaces only the stopped one, and the job goes on in place.
TEST(MnistInPlaceHangTest, AStoppedWorkerIsReplacedAndItsPeersKept) {
  TempDir dir;
  const std::vector<std::string> flags = {"--standalone",
                                          "--nproc-per-node",
                                          "3",
                                          "--max-restarts",
                                          "3",
                                          "--monitor-interval",
                                          "0.05",
                                          "--worker-timeout",
                                          "2"};
  const std::string reference = RunFaultFree(dir, flags);

  Job job = StartJob(dir, flags, "agent", "summary.json");
  ASSERT_TRUE(
      WaitFor([&] { return job.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << job.err();
  VictimAndOthers workers = SplitAt(job.agent.pid(), 1);
  ASSERT_EQ(workers.others.size(), 2u) << job.err();
  ASSERT_GT(workers.victim, 0);
  ASSERT_EQ(kill(workers.victim, SIGSTOP), 0);
  ASSERT_TRUE(WaitFor(
      [&] { return job.err().find("resuming at step") != std::string::npos; },
      absl::Minutes(2)))
      << job.err();
  ExpectStillWorkers(job.agent.pid(), workers.others, job.err());
  std::vector<pid_t> after = Workers(job.agent.pid());
  EXPECT_EQ(std::find(after.begin(), after.end(), workers.victim), after.end());
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr("worker rank 1 (local 1) is hung"));
  EXPECT_THAT(job.err(), Not(HasSubstr("worker rank 0 (local 0) is hung")));
  EXPECT_THAT(job.err(), HasSubstr("replacing local rank(s) 1,"));
  ExpectExactInPlaceRun(ReadFileOrEmpty(dir.File("summary.json")), reference,
                        job.err(), 3);
}

// The longest time between two successive steps' first completions, from
// ddprun-mnist's --step-times lines ("STEP UNIX_MICROS PID").
absl::Duration LongestStepGap(const std::string& step_times) {
  std::map<int64_t, int64_t> first;  // step -> earliest completion
  for (absl::string_view line :
       absl::StrSplit(step_times, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    int64_t step = 0, micros = 0;
    if (f.size() < 2 || !absl::SimpleAtoi(f[0], &step) ||
        !absl::SimpleAtoi(f[1], &micros)) {
      continue;
    }
    auto [it, inserted] = first.emplace(step, micros);
    if (!inserted) it->second = std::min(it->second, micros);
  }
  absl::Duration longest;
  for (auto it = first.begin(); it != first.end(); ++it) {
    auto next = std::next(it);
    if (next == first.end() || next->first != it->first + 1) continue;
    longest = std::max(longest, absl::Microseconds(next->second - it->second));
  }
  return longest;
}

// A worker of a 3-rank job (rank `victim`, 1 unless said) hangs for good
// after its step, on SIGUSR2 (ddprun-mnist's `hang_flags`), alive and not
// stopped, while its peers wait for it in the next step's sync. With the
// default hang bounds it is found (the agent logs `hung_regex`) long before
// the step's 10 s bound would find it silent; only it is replaced, and the
// job ends as the fault-free run does.
void ExpectAHangOnSigusr2IsFoundAndReplaced(
    const std::vector<std::string>& hang_flags, const std::string& logged,
    const std::string& hung_regex, int victim = 1, bool signal_early = false) {
  TempDir dir;
  const std::vector<std::string> flags = {"--standalone", "--nproc-per-node",
                                          "3", "--max-restarts", "3"};
  const std::string reference = RunFaultFree(dir, flags);
  Job job =
      StartJob(dir, flags, "agent", "summary.json", Prewarm::kOff,
               Concat(hang_flags, {"--step-times", dir.File("steps.txt")}));
  VictimAndOthers workers;
  if (signal_early) {
    // Once the victim catches the signal (its handler is set as training
    // begins, before the data is loaded): long before its first checkpoint.
    ASSERT_TRUE(WaitFor(
        [&] {
          workers = SplitAt(job.agent.pid(), victim);
          return workers.victim > 0 && CatchesSignal(workers.victim, SIGUSR2);
        },
        absl::Minutes(3)))
        << job.err();
  } else {
    // After the first evaluation: the program has shown that it reports its
    // work between steps.
    ASSERT_TRUE(
        WaitFor([&] { return job.err().find("epoch 1/") != std::string::npos; },
                absl::Minutes(3)))
        << job.err();
    workers = SplitAt(job.agent.pid(), victim);
  }
  ASSERT_GT(workers.victim, 0) << job.err();
  ASSERT_EQ(kill(workers.victim, SIGUSR2), 0);
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  EXPECT_THAT(job.err(), HasSubstr(logged)) << job.err();
  EXPECT_THAT(job.err(), ::testing::ContainsRegex(hung_regex));
  EXPECT_THAT(job.err(), Not(HasSubstr("no progress for")));
  for (int rank = 0; rank < 3; ++rank) {
    if (rank == victim) continue;
    EXPECT_THAT(job.err(), Not(HasSubstr(absl::StrCat("rank ", rank, " (local ",
                                                      rank, ") is hung"))));
  }
  EXPECT_THAT(job.err(),
              HasSubstr(absl::StrCat("replacing local rank(s) ", victim, ",")));
  ExpectExactInPlaceRun(ReadFileOrEmpty(dir.File("summary.json")), reference,
                        job.err(), 3);
  // The figure (bench/fault/README.md), not a bound: this machine's load
  // decides it.
  std::cout << "longest gap between two steps: "
            << LongestStepGap(ReadFileOrEmpty(dir.File("steps.txt")))
            << std::endl;
}

// A deadlock: asleep and using no CPU (--test-block-on-sigusr2). It is
// found blocked, and quiet: it reads and writes nothing and has no child
// process, so its bound is the quiet one (PhaseBounds::QuietBound).
TEST(MnistInPlaceHangTest, ADeadlockedWorkerIsFoundBlockedAndReplaced) {
  ExpectAHangOnSigusr2IsFoundAndReplaced(
      {"--test-block-on-sigusr2"}, "rank 1 blocks for good",
      "worker rank 1 \\(local 1\\) is hung: blocked for [0-9.]+m?s in "
      "phase step: asleep without using CPU while local rank [02] waited "
      "for it, and quiet \\(no bytes read or written, no child process\\) "
      "\\(a deadlock");
}

// A loop that never ends: running on one core (--test-spin-on-sigusr2).
// It is found spinning once it used the spin bound of CPU.
TEST(MnistInPlaceHangTest, ASpinningWorkerIsFoundSpinningAndReplaced) {
  ExpectAHangOnSigusr2IsFoundAndReplaced(
      {"--test-spin-on-sigusr2"}, "rank 1 spins for good",
      "worker rank 1 \\(local 1\\) is hung: spinning for [0-9.]+m?s in "
      "phase step: used [0-9.]+m?s of CPU without finishing its step while "
      "local rank [02] waited for it");
}

// A loop that never ends inside a checkpoint write (--test-spin-in-
// checkpoint-on-sigusr2): rank 0, the writer, runs on one core in the
// checkpoint's phase while its peers, with nothing to write, wait for it in
// their next step's sync. It is found spinning there, by the CPU its own
// earlier checkpoints took, not at the checkpoint's bound (30 s once
// learned).
TEST(MnistInPlaceHangTest, ASpinInACheckpointWriteIsFoundSpinning) {
  TempDir checkpoints;
  ExpectAHangOnSigusr2IsFoundAndReplaced(
      {"--test-spin-in-checkpoint-on-sigusr2", "--checkpoint-dir",
       checkpoints.path(), "--checkpoint-every", "5"},
      "rank 0 spins for good in its checkpoint after step",
      "worker rank 0 \\(local 0\\) is hung: spinning for [0-9.]+m?s in "
      "phase checkpoint: used [0-9.]+m?s of CPU without finishing its "
      "checkpoint write while local rank [12] waited for it",
      /*victim=*/0);
}

// A deadlock inside a checkpoint write (--test-block-in-checkpoint-on-
// sigusr2): rank 0, the writer, sleeps in the checkpoint's phase while its
// peers, with nothing to write, wait for it in their next step's sync. It
// is found blocked in the checkpoint, by what its own earlier checkpoints
// took, not at the checkpoint's bound (30 s once learned).
TEST(MnistInPlaceHangTest, ADeadlockInACheckpointWriteIsFoundBlocked) {
  TempDir checkpoints;
  ExpectAHangOnSigusr2IsFoundAndReplaced(
      {"--test-block-in-checkpoint-on-sigusr2", "--checkpoint-dir",
       checkpoints.path(), "--checkpoint-every", "5"},
      "rank 0 blocks for good in its checkpoint after step",
      "worker rank 0 \\(local 0\\) is hung: blocked for [0-9.]+m?s in "
      "phase checkpoint: asleep without using CPU while local rank [12] "
      "waited for it",
      /*victim=*/0);
}

// A deadlock in the writer's first checkpoint of the job: signalled as
// training begins, rank 0 blocks at the end of its first checkpoint write
// (at the first epoch's end, step 125). Never seen to end a checkpoint, it
// is found by its quiet (no CPU, no I/O, no child process), not after the
// 10 s that a first checkpoint's wait on a socket may take.
TEST(MnistInPlaceHangTest, ADeadlockInARanksFirstCheckpointIsFoundQuiet) {
  TempDir checkpoints;
  ExpectAHangOnSigusr2IsFoundAndReplaced(
      {"--test-block-in-checkpoint-on-sigusr2", "--checkpoint-dir",
       checkpoints.path()},
      "rank 0 blocks for good in its checkpoint after step 125",
      "worker rank 0 \\(local 0\\) is hung: blocked for [0-9.]+m?s in "
      "phase checkpoint: asleep without using CPU while local rank [12] "
      "waited for it, and quiet \\(no bytes read or written, no child "
      "process\\) the first time this rank was there",
      /*victim=*/0, /*signal_early=*/true);
}

// Two agents on one host (two nodes): a worker of node 1 is killed; the
// workers of node 0 learn the new round from their agent's heartbeat and
// keep their pids, as do node 1's survivors.
TEST(MnistInPlaceTwoAgentsTest, AWorkerOnTheOtherNodeKeepsItsPid) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto flags_of = [&](const std::string& run_id, int node_rank) {
    return std::vector<std::string>{
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-endpoint",
        (*server)->endpoint(),
        "--rdzv-id",
        run_id,
        "--node-rank",
        std::to_string(node_rank),
        "--monitor-interval",
        "0.05",
        "--max-restarts",
        "3",
        "--rdzv-conf",
        "heartbeat_interval=0.2,heartbeat_timeout=5,last_call_timeout=1"};
  };
  std::string reference;
  {
    Job a = StartJob(dir, flags_of("reference", 0), "ref0", "reference.json");
    Job b = StartJob(dir, flags_of("reference", 1), "ref1", "reference1.json");
    std::optional<ExitInfo> ea = a.agent.Wait(absl::Minutes(4));
    std::optional<ExitInfo> eb = b.agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(ea.has_value() && ea->ok()) << a.err();
    ASSERT_TRUE(eb.has_value() && eb->ok()) << b.err();
    reference = ReadFileOrEmpty(dir.File("reference.json"));
  }
  Job node0 = StartJob(dir, flags_of("inplace", 0), "agent0", "summary.json");
  Job node1 = StartJob(dir, flags_of("inplace", 1), "agent1", "summary1.json");
  ASSERT_TRUE(
      WaitFor([&] { return node0.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << node0.err() << node1.err();
  std::vector<pid_t> unaffected = Workers(node0.agent.pid());
  std::vector<pid_t> failing = Workers(node1.agent.pid());
  ASSERT_EQ(unaffected.size(), 2u) << node0.err();
  ASSERT_EQ(failing.size(), 2u) << node1.err();
  // Node 1's local rank 1 (global rank 3).
  pid_t victim = -1;
  pid_t node1_survivor = -1;
  for (pid_t pid : failing) (RankOf(pid) == 3 ? victim : node1_survivor) = pid;
  ASSERT_GT(victim, 0);
  ASSERT_GT(node1_survivor, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] { return node0.err().find("resuming at step") != std::string::npos; },
      absl::Minutes(2)))
      << node0.err() << node1.err();
  std::vector<pid_t> after0 = Workers(node0.agent.pid());
  EXPECT_EQ(after0, unaffected) << node0.err();
  std::vector<pid_t> after1 = Workers(node1.agent.pid());
  EXPECT_NE(std::find(after1.begin(), after1.end(), node1_survivor),
            after1.end())
      << node1.err();
  std::optional<ExitInfo> e0 = node0.agent.Wait(absl::Minutes(4));
  std::optional<ExitInfo> e1 = node1.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(e0.has_value() && e0->ok()) << node0.err();
  ASSERT_TRUE(e1.has_value() && e1->ok()) << node1.err();
  EXPECT_THAT(node0.err(), HasSubstr("continue in place"));
  EXPECT_THAT(node1.err(), HasSubstr("recovering in place"));
  ExpectExactInPlaceRun(ReadFileOrEmpty(dir.File("summary.json")), reference,
                        node0.err() + node1.err(), 4);
}

// A bounded, seeded chaos run on one node: three faults, each a kill -9 or
// a SIGSTOP of a random worker at a random moment after the previous
// recovery. Every fault is recovered in place: the job completes with the
// fault-free accuracy, exact sample accounting, one restart per fault, and
// the workers no fault touched keep their pids throughout.
TEST(MnistInPlaceChaosTest, SeededKillsAndHangsAreEachRecoveredInPlace) {
  constexpr int kFaults = 3;
  constexpr int kChaosEpochs = 8;
  const uint32_t seed = 20261203;
  std::mt19937 rng(seed);
  TempDir dir;
  const std::vector<std::string> flags = {"--standalone",
                                          "--nproc-per-node",
                                          "3",
                                          "--max-restarts",
                                          "5",
                                          "--monitor-interval",
                                          "0.05",
                                          "--worker-timeout",
                                          "2"};
  auto with_epochs = [&](const std::string& summary) {
    std::vector<std::string> args = MnistArgs(dir, summary);
    args[2] = std::to_string(kChaosEpochs);
    return Concat(Concat({Ddprun(), "--no-prewarm"}, flags), args);
  };
  auto start = [&](const std::string& name, const std::string& summary) {
    SubprocessOptions options;
    options.argv = with_epochs(summary);
    options.stderr_path = dir.File(name + ".err");
    options.stdout_path = dir.File(name + ".out");
    auto agent = Subprocess::Start(options);
    EXPECT_TRUE(agent.ok()) << agent.status();
    return Job{std::move(*agent), options.stderr_path};
  };
  std::string reference;
  {
    Job ref = start("reference", "reference.json");
    std::optional<ExitInfo> exit = ref.agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(exit.has_value() && exit->ok()) << ref.err();
    reference = ReadFileOrEmpty(dir.File("reference.json"));
  }
  Job job = start("agent", "summary.json");
  ASSERT_TRUE(
      WaitFor([&] { return job.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << job.err();
  std::set<pid_t> untouched;
  for (pid_t pid : Workers(job.agent.pid())) untouched.insert(pid);
  ASSERT_EQ(untouched.size(), 3u) << job.err();
  // One worker is never a victim, so that the pid check always bites.
  const pid_t keeper = *std::next(
      untouched.begin(), std::uniform_int_distribution<int>(0, 2)(rng));
  auto count = [&](const std::string& what) {
    const std::string log = job.err();
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos;
         at = log.find(what, at + 1)) {
      ++n;
    }
    return n;
  };
  for (int fault = 0; fault < kFaults; ++fault) {
    // The newcomer of the previous fault has trained a step, then a random
    // moment of training passes.
    ASSERT_TRUE(WaitFor(
        [&] {
          return count("resuming at step") >= static_cast<size_t>(2 * fault);
        },
        absl::Minutes(2)))
        << job.err();
    absl::SleepFor(
        absl::Milliseconds(std::uniform_int_distribution<int>(50, 400)(rng)));
    std::vector<pid_t> workers = Workers(job.agent.pid());
    ASSERT_EQ(workers.size(), 3u) << job.err();
    auto kept = std::find(workers.begin(), workers.end(), keeper);
    ASSERT_NE(kept, workers.end()) << "the keeper was restarted\n" << job.err();
    workers.erase(kept);
    const pid_t victim = workers[std::uniform_int_distribution<size_t>(
        0, workers.size() - 1)(rng)];
    const bool hang = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
    untouched.erase(victim);
    ASSERT_EQ(kill(victim, hang ? SIGSTOP : SIGKILL), 0);
  }
  // After the last recovery the workers no fault touched still run.
  ASSERT_TRUE(WaitFor(
      [&] {
        return count("resuming at step") >= static_cast<size_t>(2 * kFaults);
      },
      absl::Minutes(2)))
      << job.err();
  std::vector<pid_t> running = Workers(job.agent.pid());
  ASSERT_TRUE(untouched.count(keeper));
  for (pid_t pid : untouched) {
    EXPECT_NE(std::find(running.begin(), running.end(), pid), running.end())
        << "untouched worker " << pid << " was restarted\n"
        << job.err();
  }
  std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(6));
  ASSERT_TRUE(exit.has_value()) << job.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job.err();
  // One new round, one restart, per fault.
  EXPECT_THAT(job.err(), HasSubstr(absl::StrCat("restart ", kFaults, "/5")));
  EXPECT_THAT(job.err(),
              Not(HasSubstr(absl::StrCat("restart ", kFaults + 1, "/5"))));
  EXPECT_EQ(count("recovering in place"), static_cast<size_t>(kFaults));
  const std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  EXPECT_EQ(SummaryList(summary, "resumed_at_steps").size(),
            static_cast<size_t>(kFaults))
      << summary;
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(kChaosEpochs, kTrainSamples))
      << summary;
  EXPECT_EQ(SummaryNumber(summary, "steps"), SummaryNumber(reference, "steps"));
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  std::optional<double> expected = SummaryNumber(reference, "test_accuracy");
  ASSERT_TRUE(accuracy.has_value() && expected.has_value());
  EXPECT_NEAR(*accuracy, *expected, kAccuracyTolerance);
}

// Flags of one agent of a multi-agent job on the rendezvous at
// `endpoint`.
std::vector<std::string> NodeFlags(const std::string& endpoint,
                                   const std::string& run_id,
                                   const std::string& nnodes, int node_rank,
                                   const std::string& last_call,
                                   int nproc = 1) {
  return {"--nnodes",
          nnodes,
          "--nproc-per-node",
          std::to_string(nproc),
          "--rdzv-endpoint",
          endpoint,
          "--rdzv-id",
          run_id,
          "--node-rank",
          std::to_string(node_rank),
          "--monitor-interval",
          "0.05",
          "--max-restarts",
          "3",
          "--rdzv-conf",
          "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=" +
              last_call};
}

// The fault-free run of the agents `flags` name, all at once: the summary
// of rank 0 (`name`.json).
std::string RunFaultFreeNodes(
    const TempDir& dir, const std::string& name,
    const std::vector<std::vector<std::string>>& flags) {
  std::vector<Job> jobs;
  for (size_t i = 0; i < flags.size(); ++i) {
    jobs.push_back(StartJob(
        dir, flags[i], absl::StrCat(name, i),
        i == 0 ? name + ".json" : absl::StrCat(name, "-", i, ".json")));
  }
  for (Job& job : jobs) {
    std::optional<ExitInfo> exit = job.agent.Wait(absl::Minutes(4));
    EXPECT_TRUE(exit.has_value() && exit->ok()) << job.err();
  }
  return ReadFileOrEmpty(dir.File(name + ".json"));
}

// Two agents of one rank each, against a rendezvous of their own: the
// fault-free run, then the same job with `mnist` flags, where `fault(agent0,
// agent1)` strikes once node 0 logged its first evaluation. Both agents must
// end well. nullopt: the run did not get that far (a failure is recorded).
struct LoneNodes {
  std::string reference;  // rank 0's summary of the fault-free run
  std::string summary;    // and of the faulted one
  std::string err0;       // each agent's log (its workers' too)
  std::string err1;
  std::string errs() const { return err0 + err1; }
};

std::optional<LoneNodes> RunTwoLoneNodes(
    const TempDir& dir, const std::vector<std::string>& mnist,
    const std::function<void(pid_t, pid_t)>& fault) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return std::nullopt;
  auto flags_of = [&](const std::string& run_id, int node_rank) {
    return NodeFlags((*server)->endpoint(), run_id, "2", node_rank, "30");
  };
  LoneNodes run;
  run.reference = RunFaultFreeNodes(
      dir, "reference", {flags_of("reference", 0), flags_of("reference", 1)});
  Job node0 = StartJob(dir, flags_of("faulted", 0), "agent0", "summary.json",
                       Prewarm::kOff, mnist);
  Job node1 = StartJob(dir, flags_of("faulted", 1), "agent1", "summary1.json",
                       Prewarm::kOff, mnist);
  auto errs = [&] { return node0.err() + node1.err(); };
  // After the first evaluation, as the other hang tests.
  const bool evaluated =
      WaitFor([&] { return node0.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3));
  EXPECT_TRUE(evaluated) << errs();
  if (evaluated) fault(node0.agent.pid(), node1.agent.pid());
  std::optional<ExitInfo> e0 = node0.agent.Wait(absl::Minutes(4));
  std::optional<ExitInfo> e1 = node1.agent.Wait(absl::Minutes(4));
  run.err0 = node0.err();
  run.err1 = node1.err();
  EXPECT_TRUE(e0.has_value() && e0->ok()) << run.errs();
  EXPECT_TRUE(e1.has_value() && e1->ok()) << run.errs();
  if (!evaluated || !e0 || !e0->ok() || !e1 || !e1->ok()) return std::nullopt;
  run.summary = ReadFileOrEmpty(dir.File("summary.json"));
  return run;
}

// A node's only rank hangs for good after its step (ddprun-mnist's
// `hang_flag` on SIGUSR2) while the other node's only rank waits for it in
// the next step's sync. No local peer waits for it; the server's answer
// that a rank of the round completed the next step (round_steps) tells its
// agent that one of another node does. It is found as with a local peer
// (the agent logs `hung_regex`), not at the step's bound twice over (10 s,
// then as long again for another node's report), and replaced in place;
// the job ends as the fault-free run does.
void ExpectALoneRankHangIsFound(const std::string& hang_flag,
                                const std::string& hung_regex) {
  TempDir dir;
  std::optional<LoneNodes> run =
      RunTwoLoneNodes(dir, {hang_flag, "--step-times", dir.File("steps.txt")},
                      [](pid_t, pid_t agent1) {
                        const std::vector<pid_t> victims = Workers(agent1);
                        ASSERT_EQ(victims.size(), 1u);
                        ASSERT_EQ(kill(victims[0], SIGUSR2), 0);
                      });
  ASSERT_TRUE(run.has_value());
  EXPECT_THAT(run->err1, ::testing::ContainsRegex(hung_regex)) << run->errs();
  EXPECT_THAT(run->errs(), Not(HasSubstr("no progress for")));
  EXPECT_THAT(run->err0, Not(HasSubstr("is hung")));
  ExpectExactInPlaceRun(run->summary, run->reference, run->errs(), 2);
  // The figure (bench/fault/README.md), not a bound.
  std::cout << "longest gap between two steps: "
            << LongestStepGap(ReadFileOrEmpty(dir.File("steps.txt")))
            << std::endl;
}

TEST(MnistInPlaceTwoAgentsTest, ANodesOnlyRankDeadlockedIsFoundBlocked) {
  ExpectALoneRankHangIsFound(
      "--test-block-on-sigusr2",
      "worker rank 1 \\(local 0\\) is hung: blocked for [0-9.]+m?s in "
      "phase step: asleep without using CPU while a rank of another node "
      "waited for it");
}

TEST(MnistInPlaceTwoAgentsTest, ANodesOnlyRankSpinningIsFoundSpinning) {
  ExpectALoneRankHangIsFound(
      "--test-spin-on-sigusr2",
      "worker rank 1 \\(local 0\\) is hung: spinning for [0-9.]+m?s in "
      "phase step: used [0-9.]+m?s of CPU without finishing its step while "
      "a rank of another node waited for it");
}

// A node's only rank deadlocks in the state sync: node 0's worker is
// killed, and its replacement, receiving the state, blocks for good between
// two collectives of the sync (--test-block-in-sync receiver:), while node
// 1's survivor, sending it, waits in the next. No local peer is past it;
// the server's answer that a rank of the round got further through the
// sync (round_sync) tells its agent that one of another node waits. It is
// found blocked in the sync within about a second, not at the sync's bound
// (120 s, then as long again for another node's report), and the survivor
// hands its state to the next replacement: no step lost, every sample
// once.
TEST(MnistInPlaceTwoAgentsTest, ANodesOnlyRankDeadlockedInTheSyncIsFound) {
  TempDir dir;
  const std::string marker = dir.File("blocked-in-sync");
  std::optional<LoneNodes> run =
      RunTwoLoneNodes(dir, {"--test-block-in-sync", "receiver:" + marker},
                      [](pid_t agent0, pid_t) {
                        const std::vector<pid_t> victims = Workers(agent0);
                        ASSERT_EQ(victims.size(), 1u);
                        ASSERT_EQ(kill(victims[0], SIGKILL), 0);
                      });
  ASSERT_TRUE(run.has_value());
  EXPECT_FALSE(ReadFileOrEmpty(marker).empty())
      << "nobody blocked in the sync\n"
      << run->errs();
  EXPECT_THAT(run->err0, HasSubstr("blocks for good"));
  EXPECT_THAT(run->err0,
              ::testing::ContainsRegex(
                  "worker rank 0 \\(local 0\\) is hung: blocked for "
                  "[0-9.]+m?s in phase sync: asleep without using CPU while "
                  "a rank of another node waited for it"))
      << run->errs();
  EXPECT_THAT(run->errs(), Not(HasSubstr("no progress for")));
  EXPECT_THAT(run->err1, Not(HasSubstr("is hung")));
  EXPECT_THAT(run->errs(), Not(HasSubstr("resuming from step")));
  // The survivor stopped once and resumed where it stopped, both times.
  std::vector<std::pair<int64_t, int64_t>> stops = StoppedAndResumed(run->err1);
  ASSERT_GE(stops.size(), 1u) << run->errs();
  for (const auto& [stopped, resumed] : stops) {
    EXPECT_EQ(stopped, resumed) << "steps lost\n" << run->errs();
  }
  ASSERT_FALSE(run->summary.empty()) << run->errs();
  EXPECT_EQ(SummaryNumber(run->summary, "world_size"), 2);
  EXPECT_EQ(SummaryList(run->summary, "epoch_samples"),
            std::vector<int64_t>(kEpochs, kTrainSamples))
      << run->summary;
  EXPECT_EQ(SummaryNumber(run->summary, "steps"),
            SummaryNumber(run->reference, "steps"));
}

// The summary's accounting after in-place rounds: every epoch adds up to
// the data set and `resumes` in-place recoveries. The accuracy is that of
// the fault-free run (same seed) within kAccuracyTolerance; a run whose
// world changed takes as many steps at each world as it happened to, so
// it lies between the fault-free runs at its worlds (`references`).
void ExpectExactAccounting(const std::string& summary,
                           const std::vector<std::string>& references,
                           int world_size, size_t resumes,
                           const std::string& log) {
  ASSERT_FALSE(summary.empty()) << log;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), world_size) << summary;
  EXPECT_EQ(SummaryList(summary, "resumed_at_steps").size(), resumes)
      << summary << log;
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(kEpochs, kTrainSamples))
      << summary;
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  ASSERT_TRUE(accuracy.has_value());
  EXPECT_GE(*accuracy, kMinAccuracy);
  double low = 1;
  double high = 0;
  for (const std::string& reference : references) {
    std::optional<double> expected = SummaryNumber(reference, "test_accuracy");
    ASSERT_TRUE(expected.has_value()) << reference;
    low = std::min(low, *expected);
    high = std::max(high, *expected);
  }
  EXPECT_GE(*accuracy, low - kAccuracyTolerance);
  EXPECT_LE(*accuracy, high + kAccuracyTolerance);
}

// A node is lost (its agent killed, its worker with it): the survivor's
// agent learns the new round by heartbeat, and its worker goes on in place
// in a smaller world (--nnodes 1:2), from the last step both ranks
// completed; the rest of the epoch is split over the ranks left, each
// sample once. (The long last call makes the first round hold both nodes.)
TEST(MnistInPlaceTwoAgentsTest, ALostNodeShrinksTheWorldInPlace) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto flags_of = [&](const std::string& run_id, int node_rank) {
    return NodeFlags((*server)->endpoint(), run_id, "1:2", node_rank, "30");
  };
  const std::string reference2 =
      RunFaultFreeNodes(dir, "reference2",
                        {flags_of("reference2", 0), flags_of("reference2", 1)});
  const std::string reference1 = RunFaultFreeNodes(
      dir, "reference1",
      {NodeFlags((*server)->endpoint(), "reference1", "1:2", 0, "0.5")});
  Job survivor = StartJob(dir, flags_of("shrink", 0), "agent0", "summary.json");
  Job victim = StartJob(dir, flags_of("shrink", 1), "agent1", "summary1.json");
  ASSERT_TRUE(WaitFor(
      [&] { return survivor.err().find("epoch 1/") != std::string::npos; },
      absl::Minutes(3)))
      << survivor.err() << victim.err();
  EXPECT_THAT(survivor.err(), HasSubstr("of 2, ranks 0..0 of 2"));
  std::vector<pid_t> workers = Workers(survivor.agent.pid());
  ASSERT_EQ(workers.size(), 1u) << survivor.err();
  victim.agent.Signal(SIGKILL);
  ASSERT_TRUE(WaitFor(
      [&] {
        return survivor.err().find("resuming at step") != std::string::npos;
      },
      absl::Minutes(2)))
      << survivor.err();
  EXPECT_EQ(Workers(survivor.agent.pid()), workers) << survivor.err();
  std::optional<ExitInfo> exit = survivor.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << survivor.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << survivor.err();
  EXPECT_THAT(survivor.err(), HasSubstr("as rank 0 of 1"));
  EXPECT_THAT(survivor.err(), HasSubstr("continue in place"));
  const std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ExpectExactAccounting(summary, {reference2, reference1}, 1, 1,
                        survivor.err());
  // Resumed at the last step both ranks completed: the survivor's own
  // (the lost rank trained in lockstep with it), none lost, none repeated.
  std::vector<int64_t> resumed = SummaryList(summary, "resumed_at_steps");
  std::vector<std::pair<int64_t, int64_t>> stops =
      StoppedAndResumed(survivor.err());
  ASSERT_EQ(stops.size(), 1u) << survivor.err();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(stops[0].first, resumed[0]) << "steps lost";
  EXPECT_EQ(stops[0].second, resumed[0]);
  EXPECT_GT(resumed[0], 0) << "the job started over";
}

// A lost node of three (--nnodes 2:3, one worker each): the two left go on
// in place in a world of two, from the last step all three completed. With
// 12001 samples a whole epoch at 3 ranks pads 2 (not counted), and the rest
// of the cut epoch after k steps of 96, 12001 - 96k, is odd: it is split
// unevenly over the 2 ranks (rank 1 takes part in the last step without a
// sample when the split crosses a step), each sample once.
TEST(MnistInPlaceTwoAgentsTest, ALostNodeOfThreeShrinksToAnUnevenSplit) {
  constexpr int kSamples = 12001;
  constexpr int kShrinkEpochs = 2;
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto start = [&](int node_rank) {
    SubprocessOptions options;
    options.argv =
        Concat(Concat({Ddprun(), "--no-prewarm"},
                      NodeFlags((*server)->endpoint(), "shrink3", "2:3",
                                node_rank, "30")),
               SmallMnistArgs(dir, absl::StrCat("summary", node_rank, ".json"),
                              kSamples, kShrinkEpochs));
    options.stderr_path = dir.File(absl::StrCat("agent", node_rank, ".err"));
    options.stdout_path = dir.File(absl::StrCat("agent", node_rank, ".out"));
    auto agent = Subprocess::Start(options);
    EXPECT_TRUE(agent.ok()) << agent.status();
    return Job{std::move(*agent), options.stderr_path};
  };
  Job node0 = start(0);
  Job node1 = start(1);
  Job node2 = start(2);
  ASSERT_TRUE(
      WaitFor([&] { return node0.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << node0.err() << node1.err() << node2.err();
  EXPECT_THAT(node0.err(), HasSubstr("of 3, ranks 0..0 of 3"));
  const std::vector<pid_t> workers0 = Workers(node0.agent.pid());
  const std::vector<pid_t> workers1 = Workers(node1.agent.pid());
  ASSERT_EQ(workers0.size(), 1u) << node0.err();
  ASSERT_EQ(workers1.size(), 1u) << node1.err();
  node2.agent.Signal(SIGKILL);
  for (Job* job : {&node0, &node1}) {
    std::optional<ExitInfo> exit = job->agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(exit.has_value()) << job->err();
    ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job->err();
    EXPECT_THAT(job->err(), HasSubstr("continue in place"));
  }
  const std::string log = node0.err() + node1.err();
  EXPECT_THAT(node0.err(), HasSubstr("as rank 0 of 2"));
  EXPECT_THAT(log, Not(HasSubstr("started anew")));
  // Both survivors went on in place, from the same step: the last one
  // every rank completed.
  std::vector<std::pair<int64_t, int64_t>> stops = StoppedAndResumed(log);
  ASSERT_EQ(stops.size(), 2u) << log;
  const std::string summary = ReadFileOrEmpty(dir.File("summary0.json"));
  ASSERT_FALSE(summary.empty()) << log;
  std::vector<int64_t> resumed = SummaryList(summary, "resumed_at_steps");
  ASSERT_EQ(resumed.size(), 1u) << summary;
  EXPECT_GT(resumed[0], 0) << "the job started over";
  EXPECT_EQ(std::max(stops[0].first, stops[1].first), resumed[0]);
  EXPECT_EQ(stops[0].second, resumed[0]);
  EXPECT_EQ(stops[1].second, resumed[0]);
  EXPECT_EQ(SummaryNumber(summary, "world_size"), 2);
  EXPECT_EQ(SummaryNumber(summary, "epoch_size"), kSamples);
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(kShrinkEpochs, kSamples))
      << summary;
}

// The node lost is the one the world grew by, while the new round forms:
// the survivor trains alone (--nnodes 1:2), a second node joins, the
// survivor's worker goes on in place into the round of two, and that
// node's agent is killed as its worker starts, before the group of two
// exists. The round ends while it forms; the survivor joins the next one
// (of one) with its state, in place, instead of failing and starting over.
TEST(MnistInPlaceTwoAgentsTest, ANodeLostWhileTheWorldGrowsKeepsTheSurvivor) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto flags_of = [&](const std::string& run_id, int node_rank) {
    return NodeFlags((*server)->endpoint(), run_id, "1:2", node_rank, "0.5");
  };
  const std::string reference =
      RunFaultFreeNodes(dir, "reference", {flags_of("reference", 0)});
  Job survivor = StartJob(dir, flags_of("grow", 0), "agent0", "summary.json");
  ASSERT_TRUE(WaitFor(
      [&] { return survivor.err().find("epoch 1/") != std::string::npos; },
      absl::Minutes(3)))
      << survivor.err();
  std::vector<pid_t> workers = Workers(survivor.agent.pid());
  ASSERT_EQ(workers.size(), 1u) << survivor.err();
  Job victim = StartJob(dir, flags_of("grow", 1), "agent1", "summary1.json");
  ASSERT_TRUE(WaitFor(
      [&] {
        return victim.err().find("started 1 workers") != std::string::npos;
      },
      absl::Minutes(2)))
      << victim.err() << survivor.err();
  victim.agent.Signal(SIGKILL);
  ASSERT_TRUE(WaitFor(
      [&] {
        return survivor.err().find("resuming at step") != std::string::npos;
      },
      absl::Minutes(2)))
      << survivor.err();
  std::optional<ExitInfo> exit = survivor.agent.Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.has_value()) << survivor.err();
  ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << survivor.err();
  EXPECT_EQ(Children(survivor.agent.pid()).size(), 0u);
  EXPECT_THAT(survivor.err(), Not(HasSubstr("started anew")));
  EXPECT_THAT(survivor.err(), Not(HasSubstr("recovering in place")));
  EXPECT_THAT(survivor.err(), HasSubstr("restart 0/3"));
  const std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ExpectExactAccounting(summary, {reference}, 1, 1, survivor.err());
  EXPECT_GT(SummaryList(summary, "resumed_at_steps")[0], 0)
      << "the job started over";
}

// Growth in place (--nnodes 2:3): a third node joins a running job of two
// (one worker each); the running workers keep their pids and go on from
// where they were, and the newcomer takes the state of a survivor over the
// new group (no checkpoint: there is none to read). World 2 -> 3: after k
// steps of 64 the rest of the epoch, 12000 - 64k, divides by 3 only when k
// does; otherwise it is split unevenly, not padded, and the ranks with
// fewer samples take part in the last step without any: each epoch adds up
// to the data set exactly, no sample seen twice.
TEST(MnistInPlaceTwoAgentsTest, AThirdNodeJoinsARunningJobInPlace) {
  auto server = rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto flags_of = [&](const std::string& run_id, int node_rank) {
    return NodeFlags((*server)->endpoint(), run_id, "2:3", node_rank, "0.5");
  };
  const std::string reference2 =
      RunFaultFreeNodes(dir, "reference2",
                        {flags_of("reference2", 0), flags_of("reference2", 1)});
  auto fixed = [&](int node_rank) {
    return NodeFlags((*server)->endpoint(), "reference3", "3", node_rank,
                     "0.5");
  };
  const std::string reference3 =
      RunFaultFreeNodes(dir, "reference3", {fixed(0), fixed(1), fixed(2)});
  Job node0 = StartJob(dir, flags_of("grow", 0), "agent0", "summary.json");
  Job node1 = StartJob(dir, flags_of("grow", 1), "agent1", "summary1.json");
  ASSERT_TRUE(
      WaitFor([&] { return node0.err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << node0.err() << node1.err();
  const std::vector<pid_t> workers0 = Workers(node0.agent.pid());
  const std::vector<pid_t> workers1 = Workers(node1.agent.pid());
  ASSERT_EQ(workers0.size(), 1u) << node0.err();
  ASSERT_EQ(workers1.size(), 1u) << node1.err();
  Job node2 = StartJob(dir, flags_of("grow", 2), "agent2", "summary2.json");
  ASSERT_TRUE(WaitFor(
      [&] {
        return node2.err().find(
                   "joined the running job "
                   "in place") != std::string::npos;
      },
      absl::Minutes(2)))
      << node2.err() << node0.err();
  // The running workers are the same processes in the round of three.
  ASSERT_TRUE(WaitFor(
      [&] { return StoppedAndResumed(node0.err() + node1.err()).size() == 2; },
      absl::Minutes(2)))
      << node0.err() << node1.err();
  ExpectStillWorkers(node0.agent.pid(), {workers0[0]}, node0.err());
  ExpectStillWorkers(node1.agent.pid(), {workers1[0]}, node1.err());
  for (Job* job : {&node0, &node1, &node2}) {
    std::optional<ExitInfo> exit = job->agent.Wait(absl::Minutes(4));
    ASSERT_TRUE(exit.has_value()) << job->err();
    ASSERT_TRUE(exit->ok()) << exit->ToString() << "\n" << job->err();
  }
  const std::string log = node0.err() + node1.err() + node2.err();
  // Both running workers went on in place; neither was started again.
  EXPECT_EQ(StoppedAndResumed(node0.err() + node1.err()).size(), 2u) << log;
  EXPECT_THAT(log, Not(HasSubstr("started anew")));
  EXPECT_THAT(node0.err(), HasSubstr("as rank 0 of 3"));
  // The newcomer took a survivor's state, not step 0.
  std::smatch m;
  const std::string newcomer = node2.err();
  ASSERT_TRUE(std::regex_search(
      newcomer, m,
      std::regex("joined the running job in place: state of rank [01] at "
                 "step ([0-9]+)")))
      << newcomer;
  EXPECT_GT(std::stoll(m[1]), 0);
  const std::string summary = ReadFileOrEmpty(dir.File("summary.json"));
  ExpectExactAccounting(summary, {reference2, reference3}, 3, 1, log);
  EXPECT_EQ(SummaryNumber(summary, "epoch_size"), kTrainSamples);
  EXPECT_EQ(SummaryList(summary, "resumed_at_steps")[0], std::stoll(m[1]));
}

// A checkpoint written by 2 ranks mid-epoch is resumed by 3 (the sampler
// path every change of the world takes, in place too, made deterministic):
// the rest of the epoch, 1921 of 2561 samples after 10 steps of 64, does
// not divide by 3. It is not padded: rank 0 gets 641 samples, ranks 1 and 2
// 640, so rank 0 takes one step more (21 of 32); ranks 1 and 2 take part in
// it with no sample of their own (zero gradients), or rank 0 would wait for
// them in its allreduce. Every sample once: both epochs add up to the data
// set (the whole second epoch at 3 ranks pads 2561 to 2562; the repeat is
// not counted).
TEST(MnistWorldChangeTest, AnEpochResumedByMoreRanksIsSplitWithoutPadding) {
  constexpr int kSamples = 2561;
  TempDir dir;
  auto run = [&](int nproc, const std::vector<std::string>& extra,
                 const std::string& name) {
    std::vector<std::string> argv =
        Concat({Ddprun(), "--standalone", "--nproc-per-node",
                std::to_string(nproc), "--monitor-interval", "0.05"},
               SmallMnistArgs(dir, name + ".json", kSamples, 2));
    return RunToSuccess(
        dir,
        Concat(argv, Concat({"--checkpoint-dir", dir.File("checkpoints"),
                             "--checkpoint-every", "10"},
                            extra)),
        name);
  };
  const std::string first = run(2, {"--max-steps", "10"}, "two");
  EXPECT_THAT(first, HasSubstr("checkpoint of step 10 saved (epoch 1, "
                               "sample 640)"));
  const std::string log = run(3, {}, "three");
  const std::string summary = ReadFileOrEmpty(dir.File("three.json"));
  ASSERT_FALSE(summary.empty()) << log;
  EXPECT_EQ(SummaryNumber(summary, "resumed_from_step"), 10) << summary;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), 3);
  EXPECT_EQ(SummaryNumber(summary, "epoch_size"), kSamples);
  EXPECT_EQ(SummaryList(summary, "epoch_samples"),
            std::vector<int64_t>(2, kSamples))
      << summary;
  // 10 steps at 2 ranks, 21 for the rest of epoch 1 at 3, 27 for epoch 2
  // (854 per rank).
  EXPECT_EQ(SummaryNumber(summary, "steps"), 10 + 21 + 27) << summary;
  EXPECT_THAT(log, HasSubstr("rank 1 took part in 1 step(s) with no samples "
                             "of its own"));
  EXPECT_THAT(log, HasSubstr("rank 2 took part in 1 step(s) with no samples "
                             "of its own"));
  EXPECT_THAT(log, Not(HasSubstr("rank 0 took part in")));
}

// What the first worker to die in a state sync (--test-die-in-sync) wrote:
// its step then. -1 when none died.
int64_t DiedInSyncAt(const std::string& marker) {
  int64_t step = -1;
  std::string text(absl::StripAsciiWhitespace(ReadFileOrEmpty(marker)));
  if (!absl::SimpleAtoi(text, &step)) return -1;
  return step;
}

// A second fault in the middle of a recovery: the survivor
// sending its state (--test-die-in-sync source:) dies after it sent the
// record and before the model. The survivors and the new member receiving
// it abort that sync (their group fails), wait for the next round and
// sync again.
struct SyncFault {
  std::string log;
  std::string summary;
  int64_t died_at = -1;  // the step of the worker that died in the sync
};

// What the worker in `role` does in the sync: dies (--test-die-in-sync);
// stops (SIGSTOP, --test-stop-in-sync), a hang that the agent's
// --worker-timeout ends; or blocks for good (--test-block-in-sync), a
// deadlock that the agent's default bounds end.
enum class InSync { kDie, kStop, kBlock };

SyncFault RunSyncFault(int nproc, const std::string& role,
                       const std::vector<std::string>& extra,
                       InSync what = InSync::kDie) {
  TempDir dir;
  const std::string marker = dir.File("died-in-sync");
  std::vector<std::string> argv = Concat(
      {Ddprun(), "--standalone", "--nproc-per-node", std::to_string(nproc),
       "--max-restarts", "3", "--monitor-interval", "0.05"},
      what == InSync::kStop ? std::vector<std::string>{"--worker-timeout", "2"}
                            : std::vector<std::string>{});
  argv =
      Concat(argv, SmallMnistArgs(dir, "summary.json", kTrainSamples, kEpochs));
  static constexpr const char* kHook[] = {
      "--test-die-in-sync", "--test-stop-in-sync", "--test-block-in-sync"};
  const std::string hook = kHook[static_cast<int>(what)];
  argv = Concat(argv, Concat({hook, role + ":" + marker}, extra));
  SubprocessOptions options;
  options.argv = argv;
  options.stderr_path = dir.File("agent.err");
  options.stdout_path = dir.File("agent.out");
  auto agent = Subprocess::Start(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  if (!agent.ok()) return {};
  auto err = [&] { return ReadFileOrEmpty(options.stderr_path); };
  SyncFault fault;
  // Mid-training, rank 1 is killed: the first fault, which starts the
  // recovery the second one hits.
  EXPECT_TRUE(
      WaitFor([&] { return err().find("epoch 1/") != std::string::npos; },
              absl::Minutes(3)))
      << err();
  VictimAndOthers workers = SplitAt(agent->pid(), 1);
  EXPECT_GT(workers.victim, 0) << err();
  if (workers.victim <= 0) return {};
  EXPECT_EQ(kill(workers.victim, SIGKILL), 0);
  std::optional<ExitInfo> exit = agent->Wait(absl::Minutes(4));
  fault.log = err();
  EXPECT_TRUE(exit.has_value() && exit->ok())
      << (exit ? exit->ToString() : "still running") << "\n"
      << fault.log;
  fault.summary = ReadFileOrEmpty(dir.File("summary.json"));
  fault.died_at = DiedInSyncAt(marker);
  EXPECT_GE(fault.died_at, 0) << "no worker died in the sync\n" << fault.log;
  // Two faults, two new rounds; no more.
  EXPECT_THAT(fault.log, HasSubstr("restart 2/3"));
  EXPECT_THAT(fault.log, Not(HasSubstr("restart 3/3")));
  static constexpr const char* kDoes[] = {"kills itself", "stops itself",
                                          "blocks for good"};
  EXPECT_THAT(fault.log, HasSubstr(kDoes[static_cast<int>(what)]));
  EXPECT_EQ(SummaryNumber(fault.summary, "world_size"), nproc);
  EXPECT_EQ(SummaryList(fault.summary, "epoch_samples"),
            std::vector<int64_t>(kEpochs, kTrainSamples))
      << fault.summary;
  // The world stayed the same: as many steps as a fault-free run.
  const int64_t per_rank = kTrainSamples / nproc;
  EXPECT_EQ(SummaryNumber(fault.summary, "steps"),
            kEpochs * ((per_rank + 31) / 32))
      << fault.summary;
  std::optional<double> accuracy =
      SummaryNumber(fault.summary, "test_accuracy");
  EXPECT_GE(accuracy.value_or(0), kMinAccuracy) << fault.summary;
  return fault;
}

// Three workers: rank 1 is killed; ranks 0 and 2 survive and rank 0 (the
// lowest of the newest) sends the state, and dies in the middle. Rank 2
// still holds the state: the next round takes it from rank 2, and training
// goes on from rank 2's last step. The new member of the aborted round
// keeps its process (its failed sync sends it to the next round).
TEST(MnistInPlaceSyncFaultTest, TheSurvivorSendingTheStateDiesInTheSync) {
  SyncFault fault = RunSyncFault(3, "source", {});
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  // The survivor left: one in-place recovery completed, at its last step.
  std::vector<std::pair<int64_t, int64_t>> survivors =
      StoppedAndResumed(fault.log);
  ASSERT_EQ(survivors.size(), 1u) << fault.log;
  const int64_t resumed = survivors[0].second;
  EXPECT_EQ(survivors[0].first, resumed) << "steps lost";
  EXPECT_EQ(SummaryList(fault.summary, "resumed_at_steps"),
            std::vector<int64_t>{resumed})
      << fault.summary;
  // The dead source's newest step is lost at most (it may have completed
  // one more step than its peers when rank 1 died).
  EXPECT_GE(resumed, fault.died_at - 1);
  EXPECT_LE(resumed, fault.died_at);
  EXPECT_THAT(fault.log, HasSubstr("the state sync of round 1 failed"));
  EXPECT_THAT(fault.log, Not(HasSubstr("resuming from step")));
}

// Two workers: rank 1 is killed and rank 0, the only survivor, dies while
// it sends its state. Nobody holds the state any more: the next round
// finds no source and resumes from the checkpoint, the newest written
// before the second fault (the restart-all path, without a restart of the
// new member that stayed).
TEST(MnistInPlaceSyncFaultTest, TheOnlySurvivorDiesInTheSyncCheckpointResumes) {
  TempDir checkpoints;
  SyncFault fault = RunSyncFault(
      2, "source",
      {"--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "50"});
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  // The newest checkpoint of a step the dead source had reached.
  int64_t newest = -1;
  std::regex saved("checkpoint of step ([0-9]+) saved");
  for (auto it =
           std::sregex_iterator(fault.log.begin(), fault.log.end(), saved);
       it != std::sregex_iterator(); ++it) {
    const int64_t step = std::stoll((*it)[1]);
    if (step <= fault.died_at) newest = std::max(newest, step);
  }
  ASSERT_GT(newest, 0) << fault.log;
  EXPECT_LT(fault.died_at - newest, 50);
  EXPECT_EQ(SummaryNumber(fault.summary, "resumed_from_step"), newest)
      << fault.summary;
  EXPECT_THAT(fault.log, HasSubstr("the state sync of round 1 failed"));
  EXPECT_THAT(fault.log,
              HasSubstr(absl::StrCat("resuming from step ", newest, " ")));
  EXPECT_TRUE(StoppedAndResumed(fault.log).empty()) << fault.log;
}

// As TheSurvivorSendingTheStateDiesInTheSync, but the source hangs: it
// stops (SIGSTOP) in the middle of the sync, and every other rank waits
// for it there. The agent's hang detection (--worker-timeout 2) finds the
// stopped worker, kills only it, and the next round syncs from rank 2,
// which still holds the state: the job completes with its samples
// accounted exactly, no step lost, and nothing left hanging.
TEST(MnistInPlaceSyncFaultTest, TheSurvivorSendingTheStateStopsInTheSync) {
  SyncFault fault = RunSyncFault(3, "source", {}, InSync::kStop);
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  std::vector<std::pair<int64_t, int64_t>> survivors =
      StoppedAndResumed(fault.log);
  ASSERT_EQ(survivors.size(), 1u) << fault.log;
  const int64_t resumed = survivors[0].second;
  EXPECT_EQ(survivors[0].first, resumed) << "steps lost";
  EXPECT_GE(resumed, fault.died_at - 1);
  EXPECT_LE(resumed, fault.died_at);
  // Recovered by the hang timeout: the stopped source is the one hung.
  EXPECT_THAT(fault.log, HasSubstr("is hung"));
  EXPECT_THAT(fault.log, HasSubstr("the state sync of round 1 failed"));
  EXPECT_THAT(fault.log, Not(HasSubstr("resuming from step")));
}

// As TheSurvivorSendingTheStateStopsInTheSync, but the source deadlocks:
// asleep, using no CPU, not stopped, between two collectives of the sync,
// with the default bounds. Rank 2 entered the sync's next collective and
// waits there for it: it is found blocked in the sync within about a
// second (libddp's collective records), not at the sync's bound (120 s
// before the job learned it), and the next round syncs from rank 2.
TEST(MnistInPlaceSyncFaultTest, TheSurvivorSendingTheStateDeadlocksInTheSync) {
  SyncFault fault = RunSyncFault(3, "source", {}, InSync::kBlock);
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  std::vector<std::pair<int64_t, int64_t>> survivors =
      StoppedAndResumed(fault.log);
  ASSERT_EQ(survivors.size(), 1u) << fault.log;
  const int64_t resumed = survivors[0].second;
  EXPECT_EQ(survivors[0].first, resumed) << "steps lost";
  EXPECT_GE(resumed, fault.died_at - 1);
  EXPECT_LE(resumed, fault.died_at);
  EXPECT_THAT(fault.log,
              ::testing::ContainsRegex(
                  "worker rank 0 \\(local 0\\) is hung: blocked for "
                  "[0-9.]+m?s in phase sync: asleep without using CPU while "
                  "local rank [12] waited for it"));
  EXPECT_THAT(fault.log, Not(HasSubstr("no progress for")));
  EXPECT_THAT(fault.log, HasSubstr("the state sync of round 1 failed"));
  EXPECT_THAT(fault.log, Not(HasSubstr("resuming from step")));
}

// Two workers: rank 1 is killed and its replacement stops (SIGSTOP) while
// it receives rank 0's state; rank 0 waits for it in the sync. The hang
// timeout ends it, and rank 0 hands its state to the next replacement: no
// step lost, every epoch's samples accounted.
TEST(MnistInPlaceSyncFaultTest, TheNewMemberStopsWhileItReceivesTheState) {
  SyncFault fault = RunSyncFault(2, "receiver", {}, InSync::kStop);
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  std::vector<std::pair<int64_t, int64_t>> stops = StoppedAndResumed(fault.log);
  ASSERT_GE(stops.size(), 1u) << fault.log;
  ASSERT_LE(stops.size(), 2u) << fault.log;
  const int64_t resumed = stops[0].first;
  for (const auto& [stopped, resumed_at] : stops) {
    EXPECT_EQ(stopped, resumed) << fault.log;
    EXPECT_EQ(resumed_at, resumed) << fault.log;
  }
  EXPECT_THAT(fault.log, HasSubstr("is hung"));
  EXPECT_EQ(fault.died_at, 0);
}

// Two workers: rank 1 is killed and its replacement dies while it receives
// rank 0's state. Rank 0 keeps its state (whether its own sync completed
// or failed) and hands it to the next replacement: every in-place
// recovery resumes at rank 0's last step, none is lost.
TEST(MnistInPlaceSyncFaultTest, TheNewMemberDiesWhileItReceivesTheState) {
  SyncFault fault = RunSyncFault(2, "receiver", {});
  ASSERT_FALSE(fault.summary.empty()) << fault.log;
  std::vector<std::pair<int64_t, int64_t>> stops = StoppedAndResumed(fault.log);
  ASSERT_GE(stops.size(), 1u) << fault.log;
  ASSERT_LE(stops.size(), 2u) << fault.log;
  const int64_t resumed = stops[0].first;
  EXPECT_GT(resumed, 0);
  for (const auto& [stopped, resumed_at] : stops) {
    EXPECT_EQ(stopped, resumed) << fault.log;
    EXPECT_EQ(resumed_at, resumed) << fault.log;
  }
  EXPECT_EQ(SummaryList(fault.summary, "resumed_at_steps"),
            std::vector<int64_t>(stops.size(), resumed))
      << fault.summary;
  // A new member has no step of its own.
  EXPECT_EQ(fault.died_at, 0);
}

}  // namespace
}  // namespace ddprun::testing
