// StandbyPool's zygote with real processes: the pool (the agent's side)
// and libddp's AwaitActivation serving forks (tests/worker/standby_helper,
// and ddprun-mnist under the real ddprun). Each test checks which path ran:
// forked by the zygote, or started by exec after the zygote was refused.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/proc_stat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/standby_pool.h"
#include "launcher/agent/worker_env.h"
#include "launcher/posix/process_control.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Helper() {
  return testing::BinaryPath("tests/worker/standby_helper");
}

// This process's ended children, as reaped.
class Reaper {
 public:
  explicit Reaper(ProcessControl& control) : control_(control) {}
  // Reaps until `pid` has ended (bounded); how it ended.
  std::optional<ExitStatus> Until(pid_t pid) {
    testing::WaitFor(
        [&] {
          while (auto reaped = control_.ReapAny()) {
            ended_[reaped->first] = reaped->second;
          }
          return ended_.count(pid) > 0;
        },
        absl::Seconds(30));
    auto it = ended_.find(pid);
    if (it == ended_.end()) return std::nullopt;
    return it->second;
  }

 private:
  ProcessControl& control_;
  std::map<pid_t, ExitStatus> ended_;
};

// Collects the zygote's answers until `pool` holds `count` standbys.
bool WaitForStandbys(StandbyPool& pool, int count) {
  return testing::WaitFor(
      [&] {
        pool.PromoteLate();
        return pool.size() >= count;
      },
      absl::Seconds(60));
}

// Field 4 of /proc/<pid>/stat; -1 when gone.
pid_t ParentOf(pid_t pid) {
  std::vector<std::string> fields = common::ReadProcStatFields(pid);
  pid_t parent = -1;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[4 - 3], &parent)) {
    return -1;
  }
  return parent;
}

std::string Comm(pid_t pid) {
  return testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/comm"));
}

// The pool forks what it is asked for only where this process adopts
// orphans, as ddprun does (launch.cc).
class StandbyZygoteTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(BecomeSubreaper().ok()); }
};

TEST_F(StandbyZygoteTest, StandbysAreForkedByTheZygoteAndAdoptedByTheAgent) {
  PosixProcessControl control;
  Reaper reaper(control);
  testing::TempDir dir;
  pid_t zygote = -1;
  std::vector<pid_t> pids;
  {
    StandbyPool pool(control, common::RealClock::Get(), {Helper()},
                     CurrentEnvironment());
    pool.Fill(2);
    ASSERT_TRUE(WaitForStandbys(pool, 2));
    EXPECT_EQ(pool.forked(), 2);
    EXPECT_EQ(pool.execed(), 0);
    zygote = pool.zygote_pid();
    ASSERT_GT(zygote, 0);
    EXPECT_EQ(Comm(zygote), "ddprun-zygote\n");
    // This process's children: the zygote and the two standbys, which it
    // adopted (not the zygote's children), each leading its own group.
    std::set<pid_t> standbys;
    for (pid_t child : testing::Children(getpid())) {
      if (child != zygote) standbys.insert(child);
    }
    ASSERT_EQ(standbys.size(), 2u);
    for (pid_t pid : standbys) {
      EXPECT_EQ(ParentOf(pid), getpid());
      EXPECT_EQ(getpgid(pid), pid);
      // Named so in ps until activated (then the program's own, below).
      EXPECT_EQ(Comm(pid), "ddprun-standby\n");
      // The zygote left SCHED_IDLE (where it started, if this process may
      // move it back) before it forked them: they work at normal priority.
      EXPECT_EQ(sched_getscheduler(pid), SCHED_OTHER);
    }
    EXPECT_EQ(sched_getscheduler(zygote), SCHED_OTHER);

    absl::StatusOr<std::vector<WorkerSlot>> activated =
        pool.Activate({{"RANK=0", "STANDBY_HELPER_OUT=" + dir.File("0")},
                       {"RANK=1", "STANDBY_HELPER_OUT=" + dir.File("1")}});
    ASSERT_TRUE(activated.ok()) << activated.status();
    ASSERT_EQ(activated->size(), 2u);
    for (const WorkerSlot& worker : *activated) {
      pids.push_back(worker.pid);
      // Each came with the pipes it inherited as a standby.
      EXPECT_GE(worker.progress.child_fd(), 0);
      EXPECT_GE(worker.control.child_fd(), 0);
    }
    EXPECT_EQ(std::set<pid_t>(pids.begin(), pids.end()), standbys);
  }
  // Activated, each ran as a worker of its round, and this process reaps it.
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    std::optional<ExitStatus> status = reaper.Until(pids[rank]);
    ASSERT_TRUE(status.has_value()) << "standby " << pids[rank];
    EXPECT_TRUE(status->success()) << status->ToString();
    const std::string out =
        testing::ReadFileOrEmpty(dir.File(std::to_string(rank)));
    EXPECT_THAT(out, HasSubstr(absl::StrCat("RANK=", rank, "\n")));
    EXPECT_THAT(out, HasSubstr("forked=1\n"));
    EXPECT_THAT(out, HasSubstr(absl::StrCat("pid=", pids[rank], "\n")));
    EXPECT_THAT(out, HasSubstr("comm=standby_helper\n"));
    // The round's environment replaced the zygote's whole environment.
    EXPECT_THAT(out, Not(HasSubstr("DDPRUN_ZYGOTE_FD")));
    EXPECT_THAT(out, Not(HasSubstr("DDPRUN_STANDBY_FD")));
  }
  // The pool's end ends the zygote.
  EXPECT_TRUE(reaper.Until(zygote).has_value());
}

// A program that runs a thread where it waits may not fork: the zygote says
// why and exits, and the pool starts its standbys by exec.
TEST_F(StandbyZygoteTest, AZygoteThatRunsThreadsIsRefusedAndStandbysAreExeced) {
  PosixProcessControl control;
  Reaper reaper(control);
  testing::TempDir dir;
  std::vector<std::string> env = CurrentEnvironment();
  env.push_back("STANDBY_HELPER_THREAD=1");
  pid_t pid = -1;
  pid_t zygote = -1;
  {
    StandbyPool pool(control, common::RealClock::Get(), {Helper()}, env);
    pool.Fill(1);
    zygote = pool.zygote_pid();
    ASSERT_GT(zygote, 0);
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          pool.PromoteLate();
          return pool.execed() == 1 && pool.size() == 1;
        },
        absl::Seconds(60)));
    EXPECT_EQ(pool.forked(), 0);
    EXPECT_EQ(pool.zygote_pid(), -1);
    absl::StatusOr<std::vector<WorkerSlot>> activated =
        pool.Activate({{"RANK=0", "STANDBY_HELPER_OUT=" + dir.File("0")}});
    ASSERT_TRUE(activated.ok()) << activated.status();
    pid = activated->front().pid;
  }
  std::optional<ExitStatus> status = reaper.Until(pid);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success()) << status->ToString();
  EXPECT_THAT(testing::ReadFileOrEmpty(dir.File("0")), HasSubstr("forked=0\n"));
  EXPECT_TRUE(reaper.Until(zygote).has_value());
}

// ddprun's default pool: standbys only from a zygote that a worker forks.
StandbyPoolOptions Seeded() {
  StandbyPoolOptions options;
  options.exec = false;
  options.seed = true;
  return options;
}

// The seed (ddprun's default): a worker started with DDPRUN_ZYGOTE_SEED_FD
// forks the node's zygote where it waits for its round and goes on as the
// worker. The zygote is this process's child, leads its own group, writes
// to this process's output, and keeps none of the worker's channels: the
// worker's progress pipe reads end of file once the worker ends, while the
// zygote still serves.
TEST_F(StandbyZygoteTest, AWorkerForksTheZygoteAndGoesOnAsTheWorker) {
  PosixProcessControl control;
  Reaper reaper(control);
  testing::TempDir dir;
  StandbyPool pool(control, common::RealClock::Get(), {Helper()},
                   CurrentEnvironment(), Seeded());
  const int seed = pool.PlantSeed();
  ASSERT_GE(seed, 0);
  EXPECT_EQ(pool.PlantSeed(), -1) << "one seed at a time";
  int progress[2];
  ASSERT_EQ(pipe2(progress, O_CLOEXEC), 0);
  SpawnRequest worker;
  worker.argv = {Helper()};
  worker.env = CurrentEnvironment();
  worker.env.push_back(absl::StrCat("DDPRUN_ZYGOTE_SEED_FD=", seed));
  worker.env.push_back(absl::StrCat("DDPRUN_PROGRESS_FD=", progress[1]));
  worker.env.push_back("STANDBY_HELPER_OUT=" + dir.File("worker"));
  worker.env.push_back("RANK=5");
  worker.inherit_fds = {seed, progress[1]};
  absl::StatusOr<pid_t> pid = control.Spawn(worker);
  pool.SeedPlanted();
  close(progress[1]);
  ASSERT_TRUE(pid.ok()) << pid.status();

  pool.Fill(2);
  ASSERT_TRUE(WaitForStandbys(pool, 2));
  EXPECT_EQ(pool.forked(), 2);
  EXPECT_EQ(pool.execed(), 0);
  const pid_t zygote = pool.zygote_pid();
  ASSERT_GT(zygote, 0);
  EXPECT_NE(zygote, *pid);
  EXPECT_EQ(Comm(zygote), "ddprun-zygote\n");
  EXPECT_EQ(ParentOf(zygote), getpid());
  EXPECT_EQ(getpgid(zygote), zygote);
  auto link = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::read_symlink(path, ec).string();
  };
  EXPECT_EQ(link(absl::StrCat("/proc/", zygote, "/fd/1")),
            link("/proc/self/fd/1"));
  // Neither it nor its standbys show the worker's round in /proc.
  EXPECT_EQ(testing::RankOf(zygote), -1);
  for (pid_t child : testing::Children(getpid())) {
    if (child != *pid) EXPECT_EQ(testing::RankOf(child), -1) << child;
  }

  // The worker went on as the worker, and ended as one.
  std::optional<ExitStatus> status = reaper.Until(*pid);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success()) << status->ToString();
  const std::string out = testing::ReadFileOrEmpty(dir.File("worker"));
  EXPECT_THAT(out, HasSubstr("forked=0\n"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pid=", *pid, "\n")));
  EXPECT_THAT(out, HasSubstr("RANK=5\n"));
  EXPECT_THAT(out, Not(HasSubstr("DDPRUN_ZYGOTE_SEED_FD")));
  // Its progress pipe ends with it: the zygote holds no copy.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        struct pollfd p = {progress[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) return false;
        char buffer[256];
        return read(progress[0], buffer, sizeof(buffer)) == 0;
      },
      absl::Seconds(30)))
      << "the worker's progress pipe is still open";
  close(progress[0]);
  EXPECT_FALSE(testing::ProcessGone(zygote));

  // A standby it forked becomes a worker of its round.
  absl::StatusOr<std::vector<WorkerSlot>> activated =
      pool.Activate({{"RANK=0", "STANDBY_HELPER_OUT=" + dir.File("0")}});
  ASSERT_TRUE(activated.ok()) << activated.status();
  const pid_t standby = activated->front().pid;
  status = reaper.Until(standby);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success()) << status->ToString();
  const std::string standby_out = testing::ReadFileOrEmpty(dir.File("0"));
  EXPECT_THAT(standby_out, HasSubstr("RANK=0\n"));
  EXPECT_THAT(standby_out, HasSubstr("forked=1\n"));
  EXPECT_EQ(ParentOf(zygote), getpid());
}

// A worker that runs threads where it waits does not seed: it says why and
// goes on as the worker, and no seed is planted again. A worker that ends
// before it gets there (a program that never waits for its round) leaves
// the seed to the next worker.
TEST_F(StandbyZygoteTest, ASeedIsRefusedForGoodOrPlantedAgainIfItsWorkerEnded) {
  PosixProcessControl control;
  Reaper reaper(control);
  testing::TempDir dir;
  StandbyPool pool(control, common::RealClock::Get(), {Helper()},
                   CurrentEnvironment(), Seeded());
  auto run_worker = [&](std::vector<std::string> argv,
                        std::vector<std::string> extra) -> pid_t {
    const int seed = pool.PlantSeed();
    if (seed < 0) return -1;
    SpawnRequest worker;
    worker.argv = std::move(argv);
    worker.env = CurrentEnvironment();
    worker.env.push_back(absl::StrCat("DDPRUN_ZYGOTE_SEED_FD=", seed));
    for (std::string& e : extra) worker.env.push_back(std::move(e));
    worker.inherit_fds = {seed};
    absl::StatusOr<pid_t> pid = control.Spawn(worker);
    pool.SeedPlanted();
    return pid.ok() ? *pid : -1;
  };
  auto settled = [&](pid_t pid) {
    EXPECT_TRUE(reaper.Until(pid).has_value());
    pool.PromoteLate();  // reads the answer, or the end of file
  };
  // Ends before it waits for its round.
  pid_t pid = run_worker({"/bin/true"}, {});
  ASSERT_GT(pid, 0);
  settled(pid);
  EXPECT_EQ(pool.zygote_pid(), -1);
  // Runs a thread there.
  pid = run_worker({Helper()}, {"STANDBY_HELPER_THREAD=1",
                                "STANDBY_HELPER_OUT=" + dir.File("worker")});
  ASSERT_GT(pid, 0) << "a seed is planted again after its worker ended";
  settled(pid);
  EXPECT_THAT(testing::ReadFileOrEmpty(dir.File("worker")),
              HasSubstr("forked=0\n"));
  EXPECT_EQ(pool.zygote_pid(), -1);
  EXPECT_EQ(pool.PlantSeed(), -1) << "the program refused to seed";
  pool.Fill(1);
  EXPECT_EQ(pool.size(), 0);
  EXPECT_EQ(pool.execed(), 0);
}

// Where this process would not adopt the standbys, there is no zygote.
TEST(StandbyZygoteNoSubreaperTest, WithoutASubreaperStandbysAreExeced) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
  PosixProcessControl control;
  Reaper reaper(control);
  ASSERT_FALSE(control.AdoptsOrphans());
  std::vector<pid_t> started;
  {
    StandbyPool pool(control, common::RealClock::Get(), {Helper()},
                     CurrentEnvironment());
    pool.Fill(1);
    EXPECT_EQ(pool.zygote_pid(), -1);
    EXPECT_EQ(pool.execed(), 1);
    EXPECT_EQ(pool.size(), 1);
    started = testing::Children(getpid());
  }
  // Not needed: killed with the pool.
  ASSERT_EQ(started.size(), 1u);
  EXPECT_TRUE(reaper.Until(started[0]).has_value());
}

// kill -9 of ddprun: its zygote, the standbys it forked and the worker all
// end with it (PR_SET_PDEATHSIG; the standbys set it once adopted), and
// none is left behind.
TEST(StandbyZygoteAgentTest, NothingOutlivesAKilledAgent) {
  testing::TempDir dir;
  testing::SubprocessOptions options;
  // The job runs until the test kills its agent: at 100 epochs it ended on
  // a loaded CI machine before the standby was seen waiting.
  options.argv = {testing::Ddprun(),
                  "--standalone",
                  "--nproc-per-node",
                  "1",
                  "--prewarm",
                  "--monitor-interval",
                  "0.05",
                  testing::Mnist(),
                  "--epochs",
                  "100000",
                  "--train-limit",
                  "3000",
                  "--data-dir",
                  testing::MnistDir(),
                  "--save",
                  "",
                  "--no-progress"};
  options.stderr_path = dir.File("agent.err");
  options.stdout_path = dir.File("agent.out");
  auto agent = testing::Subprocess::Start(options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto err = [&] { return testing::ReadFileOrEmpty(options.stderr_path); };
  std::vector<pid_t> children;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        if (agent->Poll().has_value()) return true;
        children = testing::Children(agent->pid());
        // The worker, the zygote and one standby it forked.
        int zygotes = 0;
        int waiting = 0;
        for (pid_t pid : children) {
          if (Comm(pid) == "ddprun-zygote\n") {
            ++zygotes;
          } else if (testing::RankOf(pid) < 0 &&
                     absl::EndsWith(testing::ReadFileOrEmpty(
                                        absl::StrCat("/proc/", pid, "/wchan")),
                                    "pipe_read")) {
            ++waiting;
          }
        }
        return zygotes == 1 && waiting == 1 && children.size() == 3;
      },
      absl::Minutes(2)))
      << err();
  ASSERT_FALSE(agent->Poll().has_value()) << "the job ended first\n" << err();
  EXPECT_THAT(err(), HasSubstr("prewarmed workers fork from a zygote"));
  agent->Signal(SIGKILL);
  ASSERT_TRUE(agent->Wait(absl::Seconds(30)).has_value());
  for (pid_t pid : children) {
    EXPECT_TRUE(testing::WaitFor([&] { return testing::ProcessGone(pid); },
                                 absl::Seconds(30)))
        << "pid " << pid << " (" << Comm(pid) << ") outlived its agent\n"
        << err();
  }
}

}  // namespace
}  // namespace ddprun::launcher
