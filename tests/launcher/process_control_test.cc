// The POSIX spawner with real processes.
#include "launcher/posix/process_control.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/worker_env.h"
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

}  // namespace
}  // namespace ddprun::launcher
