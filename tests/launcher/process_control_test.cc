// The POSIX spawner with real processes.
#include "launcher/posix/process_control.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/standby_pool.h"
#include "launcher/agent/worker_env.h"
#include "tests/testing/fake_process_control.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::testing::HasSubstr;

ExitStatus WaitForExit(PosixProcessControl& control, pid_t pid) {
  std::optional<ExitStatus> status;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto reaped = control.ReapAny();
        if (reaped && reaped->first == pid) status = reaped->second;
        return status.has_value();
      },
      absl::Seconds(10)));
  return status.value_or(ExitStatus{});
}

// Kills each of `pids`' process groups and reaps them (bounded).
void KillAndReap(PosixProcessControl& control, std::vector<pid_t> pids) {
  for (pid_t pid : pids) control.SignalGroup(pid, SIGKILL);
  size_t reaped = 0;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        while (control.ReapAny().has_value()) ++reaped;
        return reaped == pids.size();
      },
      absl::Seconds(10)));
}

SpawnRequest Shell(const std::string& script) {
  SpawnRequest r;
  r.argv = {"/bin/sh", "-c", script};
  r.env = CurrentEnvironment();
  return r;
}

TEST(ProcessControlTest, DecodesExitCodes) {
  PosixProcessControl control;
  auto pid = control.Spawn(Shell("exit 3"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ExitStatus status = WaitForExit(control, *pid);
  EXPECT_EQ(status.exit_code, 3);
  EXPECT_EQ(status.ToString(), "exit code 3");
}

TEST(ProcessControlTest, DecodesSignalsByName) {
  PosixProcessControl control;
  auto pid = control.Spawn(Shell("kill -SEGV $$"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ExitStatus status = WaitForExit(control, *pid);
  EXPECT_EQ(status.signal, SIGSEGV);
  EXPECT_THAT(status.ToString(), HasSubstr("SIGSEGV"));
}

TEST(ProcessControlTest, EachWorkerLeadsItsOwnProcessGroup) {
  PosixProcessControl control;
  auto pid = control.Spawn(Shell("sleep 30"));
  ASSERT_TRUE(pid.ok());
  EXPECT_TRUE(testing::WaitFor([&] { return getpgid(*pid) == *pid; },
                               absl::Seconds(5)));
  control.SignalGroup(*pid, SIGKILL);
  EXPECT_EQ(WaitForExit(control, *pid).signal, SIGKILL);
}

// proc(5)'s layout, with a command name that holds ") S (" to mislead a
// parser that splits at the first ')'.
TEST(ProcessStateTest, ParsesTheStateAndTheCpuTimeAfterTheLastParenthesis) {
  const std::string stat =
      "4242 (evil) S (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
      "250 50 0 0 20 0 3 0 1000 0 0";
  std::optional<ProcessState> state = ParseProcessStat(stat, 100);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->state, 'S');
  EXPECT_TRUE(state->sleeping());
  EXPECT_EQ(state->cpu, absl::Seconds(3)) << "(250 + 50) ticks at 100/s";
  EXPECT_FALSE(ParseProcessStat("4242 (cut) S 1 2", 100).has_value());
  EXPECT_FALSE(ParseProcessStat("", 100).has_value());
}

// What the agent sees of a blocked worker and of a busy one: asleep with a
// CPU time that does not move, and running with one that does. The blocked
// one opens a FIFO nobody writes to: a read that never returns.
TEST(ProcessStateTest, ABlockedProcessSleepsWithoutCpuABusyOneUsesIt) {
  testing::TempDir dir;
  const std::string fifo = dir.File("never-written");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  PosixProcessControl control;
  auto blocked = control.Spawn(Shell("exec cat " + fifo));
  auto busy = control.Spawn(Shell("while :; do :; done"));
  ASSERT_TRUE(blocked.ok() && busy.ok());
  std::optional<ProcessState> first;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        first = control.State(*blocked);
        return first.has_value() && first->sleeping();
      },
      absl::Seconds(10)));
  std::optional<ProcessState> busy_first = control.State(*busy);
  ASSERT_TRUE(busy_first.has_value());
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        std::optional<ProcessState> now = control.State(*busy);
        return now.has_value() && now->cpu > busy_first->cpu;
      },
      absl::Seconds(10)))
      << "a busy loop's CPU time never moved";
  std::optional<ProcessState> second = control.State(*blocked);
  ASSERT_TRUE(second.has_value());
  EXPECT_TRUE(second->sleeping());
  EXPECT_EQ(second->cpu, first->cpu);
  ::kill(*blocked, SIGSTOP);
  EXPECT_TRUE(testing::WaitFor([&] { return control.IsStopped(*blocked); },
                               absl::Seconds(10)));
  KillAndReap(control, {*blocked, *busy});
  EXPECT_FALSE(control.State(*busy).has_value()) << "reaped: gone";
}

TEST(ProcessStateTest, ParsesTheBytesMovedFromProcIo) {
  const std::string io =
      "rchar: 1000\nwchar: 200\nsyscr: 7\nsyscw: 3\nread_bytes: 4096\n"
      "write_bytes: 8192\ncancelled_write_bytes: 0\n";
  EXPECT_EQ(ParseProcessIo(io), 1000u + 200u + 4096u + 8192u);
  EXPECT_FALSE(ParseProcessIo("rchar: 1000\nwchar: 200\n").has_value());
  EXPECT_FALSE(ParseProcessIo("").has_value());
}

// What the agent's look tells of a worker's I/O and children: a shell that
// waits for its child (a `cat` of a FIFO, started in the background) has
// one, and its I/O stands still while it waits; a process that copies data
// moves its I/O; one blocked on a FIFO has no child and moves nothing.
TEST(ProcessStateTest, TellsAProcessWithAChildAndOneDoingIoFromAQuietOne) {
  testing::TempDir dir;
  const std::string fifo = dir.File("never-written");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  PosixProcessControl control;
  auto parent = control.Spawn(Shell("cat " + fifo + " & wait"));
  auto copier = control.Spawn(Shell("exec cat /dev/zero > /dev/null"));
  auto quiet = control.Spawn(Shell("exec cat " + fifo));
  ASSERT_TRUE(parent.ok() && copier.ok() && quiet.ok());
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        std::optional<ProcessState> s = control.State(*parent);
        return s.has_value() && s->has_children == true;
      },
      absl::Seconds(10)))
      << "the shell's background sleep was never seen";
  std::optional<ProcessState> copying = control.State(*copier);
  ASSERT_TRUE(copying.has_value() && copying->io.has_value());
  EXPECT_EQ(copying->has_children, false);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        std::optional<ProcessState> s = control.State(*copier);
        return s.has_value() && s->io.has_value() && *s->io > *copying->io;
      },
      absl::Seconds(10)))
      << "a copy's I/O never moved";
  std::optional<ProcessState> first;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        first = control.State(*quiet);
        return first.has_value() && first->sleeping() && first->io.has_value();
      },
      absl::Seconds(10)));
  EXPECT_EQ(first->has_children, false);
  // The copier ran meanwhile: long enough for the blocked one to move,
  // had it anything to move.
  std::optional<ProcessState> second = control.State(*quiet);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->io, first->io);
  EXPECT_FALSE(ReadProcessState(*quiet)->io.has_value())
      << "IsStopped's read of /proc/PID/stat alone reads no more";
  KillAndReap(control, {*parent, *copier, *quiet});
}

TEST(ProcessStateTest, SeesAChildThatAHelperThreadStarted) {
  // This test's own process: a helper thread starts a `cat` of a FIFO that
  // is never written, as a program's upload thread runs a command, and
  // looks while the main thread sleeps in join() (only a sleeping worker
  // can be quiet, so only then are other threads' children looked for).
  testing::TempDir dir;
  const std::string fifo = dir.File("never-written");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::optional<ProcessState> before = ReadProcessActivity(getpid());
  ASSERT_TRUE(before.has_value());
  ASSERT_EQ(before->has_children, false);
  PosixProcessControl control;
  absl::StatusOr<pid_t> child;
  std::string main_children = "unread";
  std::optional<ProcessState> seen;
  std::thread helper([&] {
    child = control.Spawn(Shell("exec cat " + fifo));
    if (!child.ok()) return;
    testing::WaitFor(
        [] {
          std::optional<ProcessState> main = ReadProcessState(getpid());
          return main.has_value() && main->sleeping();
        },
        absl::Seconds(10));
    std::ifstream main_list(
        absl::StrFormat("/proc/%d/task/%d/children", getpid(), getpid()));
    main_children.clear();
    std::getline(main_list, main_children);
    seen = ReadProcessActivity(getpid());
  });
  helper.join();
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(main_children, "") << "the child is the helper thread's";
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->sleeping()) << "the main thread waited in join()";
  EXPECT_EQ(seen->has_children, true);
  KillAndReap(control, {*child});
}

TEST(ProcessControlTest, MissingProgramIsAClearErrorNotExit127) {
  PosixProcessControl control;
  SpawnRequest r;
  r.argv = {"ddprun-no-such-program"};
  r.env = {"PATH=/usr/bin:/bin"};
  auto pid = control.Spawn(r);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(),
              HasSubstr("cannot run 'ddprun-no-such-program'"));
  EXPECT_THAT(pid.status().message(), HasSubstr("/usr/bin:/bin"));
}

TEST(ProcessControlTest, ExecFailureComesBackThroughThePipe) {
  testing::TempDir dir;
  std::string path = dir.File("not-executable");
  FILE* f = fopen(path.c_str(), "w");
  fputs("#!/bin/sh\n", f);
  fclose(f);
  chmod(path.c_str(), 0755);
  // A directory on the way makes exec fail with ENOTDIR/EACCES in the child.
  SpawnRequest r;
  r.argv = {dir.path() + "/not-executable/x"};
  r.env = CurrentEnvironment();
  PosixProcessControl control;
  auto pid = control.Spawn(r);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr("cannot run"));
  EXPECT_THAT(pid.status().message(), HasSubstr("Not a directory"));
}

TEST(ProcessControlTest, InheritedDescriptorKeepsItsNumber) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnRequest r = Shell("echo hi >&" + std::to_string(fds[1]));
  r.inherit_fds = {fds[1]};
  PosixProcessControl control;
  auto pid = control.Spawn(r);
  ASSERT_TRUE(pid.ok());
  close(fds[1]);
  EXPECT_EQ(WaitForExit(control, *pid).exit_code, 0);
  char buf[8] = {0};
  EXPECT_EQ(read(fds[0], buf, sizeof(buf)), 3);
  EXPECT_STREQ(buf, "hi\n");
  close(fds[0]);
}

// sched(7)'s rule for leaving SCHED_IDLE without privilege, and
// CAP_SYS_NICE (bit 23 of CapEff).
TEST(ProcessControlTest, WhoMayLeaveTheIdlePolicy) {
  EXPECT_TRUE(MayLeaveIdlePolicy(uint64_t{1} << 23, 0, 0));
  EXPECT_FALSE(MayLeaveIdlePolicy(~(uint64_t{1} << 23), 0, 0));
  EXPECT_FALSE(MayLeaveIdlePolicy(0, 19, 0));
  EXPECT_TRUE(MayLeaveIdlePolicy(0, 20, 0));
  EXPECT_TRUE(MayLeaveIdlePolicy(0, 15, 5));
  EXPECT_FALSE(MayLeaveIdlePolicy(0, 14, 5));
}

std::vector<pid_t> Threads(pid_t pid) {
  std::vector<pid_t> tids;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/task", ec)) {
    tids.push_back(std::stoi(task.path().filename().string()));
  }
  return tids;
}

// A process started idle runs every thread under SCHED_IDLE (threads
// inherit it); RestoreNormalPriority moves them all back where the agent
// may, and says why not where it may not.
TEST(ProcessControlTest, IdlePriorityAppliesToEveryThreadUntilRestored) {
  SpawnRequest r;
  // Two threads that block until the test kills the process (Spawn's
  // PR_SET_PDEATHSIG ends it too should the test die first).
  r.argv = {"python3", "-c",
            "import threading\n"
            "threading.Thread(target=threading.Event().wait, daemon=True)"
            ".start()\nthreading.Event().wait()\n"};
  r.env = CurrentEnvironment();
  r.idle_priority = true;
  PosixProcessControl control;
  auto pid = control.Spawn(r);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(testing::WaitFor([&] { return Threads(*pid).size() == 2; },
                               absl::Seconds(30)));
  for (pid_t tid : Threads(*pid))
    EXPECT_EQ(sched_getscheduler(tid), SCHED_IDLE);

  absl::Status restored = control.RestoreNormalPriority(*pid);

  if (control.CanRestoreNormalPriority()) {
    ASSERT_TRUE(restored.ok()) << restored;
    for (pid_t tid : Threads(*pid)) {
      EXPECT_EQ(sched_getscheduler(tid), SCHED_OTHER);
    }
  } else {
    EXPECT_EQ(restored.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(restored.message(), HasSubstr("CAP_SYS_NICE"));
  }
  control.SignalGroup(*pid, SIGKILL);
  WaitForExit(control, *pid);
}

// A standby waits under SCHED_IDLE where the agent can move it back, and
// runs under the normal policy once activated.
TEST(StandbyPoolTest, AStandbyWaitsIdleAndWorksAtNormalPriority) {
  PosixProcessControl control;
  std::optional<pid_t> pid;
  {
    StandbyPool pool(control, common::RealClock::Get(),
                     {"/bin/sh", "-c",
                      // Waits for its round, then blocks until killed.
                      "cat <&$DDPRUN_STANDBY_FD >/dev/null; "
                      "exec tail -f /dev/null"},
                     CurrentEnvironment());
    pool.Fill(1);
    ASSERT_EQ(pool.size(), 1);
    const bool idle = control.CanRestoreNormalPriority();
    EXPECT_EQ(pool.idle_start(), idle);
    // The first standby's pid: the only child alive.
    std::vector<pid_t> children;
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          std::ifstream f("/proc/self/task/" + std::to_string(gettid()) +
                          "/children");
          children.clear();
          for (pid_t c; f >> c;) children.push_back(c);
          return !children.empty();
        },
        absl::Seconds(10)));
    EXPECT_EQ(sched_getscheduler(children[0]), idle ? SCHED_IDLE : SCHED_OTHER);

    auto activated = pool.Activate({{"RANK=0"}});

    ASSERT_TRUE(activated.ok()) << activated.status();
    ASSERT_EQ(activated->size(), 1u);
    pid = activated->front().pid;
    EXPECT_EQ(*pid, children[0]);
    EXPECT_EQ(sched_getscheduler(*pid), SCHED_OTHER);
  }
  control.SignalGroup(*pid, SIGKILL);
  WaitForExit(control, *pid);
}

// A standby the training leaves no idle CPU to start in is moved to the
// normal policy after the grace, once.
TEST(StandbyPoolTest, AStandbyStillIdleAfterTheGraceIsPromotedOnce) {
  common::FakeClock clock;
  ::ddprun::testing::FakeProcessControl control(&clock);
  control.can_restore_normal_priority = true;
  StandbyPoolOptions options;
  options.idle_grace = absl::Seconds(5);
  StandbyPool pool(control, clock, {"train"}, {}, options);
  pool.Fill(2);
  ASSERT_EQ(pool.size(), 2);
  ASSERT_EQ(control.processes().size(), 2u);
  EXPECT_TRUE(control.processes()[0].request.idle_priority);
  EXPECT_TRUE(control.processes()[1].request.idle_priority);

  pool.PromoteLate();
  clock.Advance(absl::Seconds(4));
  pool.PromoteLate();
  EXPECT_THAT(control.restored(), ::testing::IsEmpty());

  clock.Advance(absl::Seconds(2));
  pool.PromoteLate();
  pool.PromoteLate();
  EXPECT_THAT(control.restored(), ::testing::ElementsAre(1000, 1001));
}

}  // namespace
}  // namespace ddprun::launcher
