#include "launcher/posix/worker_group.h"

#include <signal.h>

#include <deque>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "tests/testing/fake_process_control.h"

namespace ddprun::launcher {
namespace {

using ::ddprun::testing::FakeProcessControl;

// "missing" cannot be spawned; "stubborn" ignores SIGTERM.
void ActLikeWorkers(FakeProcessControl& control) {
  control.refuse_spawn = [](const SpawnRequest& request) {
    return request.argv.at(0) == "missing"
               ? absl::FailedPreconditionError("cannot run 'missing'")
               : absl::OkStatus();
  };
  control.ends_on = [](const FakeProcessControl::Process& p, int sig) {
    return sig == SIGKILL ||
           (sig == SIGTERM && p.request.argv.at(0) != "stubborn");
  };
}

SpawnRequest Request(const std::string& program) {
  SpawnRequest r;
  r.argv = {program};
  return r;
}

TEST(WorkerGroupTest, ReapMapsPidsToLocalRanksAndDropsGrandchildren) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(group.Start({Request("a"), Request("b")}, absl::Seconds(1)).ok());
  std::vector<pid_t> pids = group.pids();
  control.End(pids[1], ExitStatus::Exited(3));
  control.End(4242, ExitStatus::Exited(0));  // a re-parented grandchild
  auto exits = group.Reap();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].first, 1);
  EXPECT_EQ(exits[0].second.exit_code, 3);
  EXPECT_FALSE(group.AllEnded());
}

TEST(WorkerGroupTest, StopKillsWhatIgnoresSigtermAfterOneSharedGrace) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(
      group
          .Start({Request("polite"), Request("stubborn"), Request("stubborn")},
                 absl::Seconds(1))
          .ok());
  absl::Time start = clock.Now();
  auto exits = group.Stop(absl::Seconds(3));
  EXPECT_TRUE(group.AllEnded());
  EXPECT_TRUE(control.running().empty());
  ASSERT_EQ(exits.size(), 3u);
  // One grace for all, not one per worker.
  EXPECT_GE(clock.Now() - start, absl::Seconds(3));
  EXPECT_LT(clock.Now() - start, absl::Seconds(4));
  int terms = 0, kills = 0;
  for (auto [pid, sig] : control.signals()) {
    terms += sig == SIGTERM;
    kills += sig == SIGKILL;
  }
  EXPECT_EQ(terms, 3);
  EXPECT_EQ(kills, 3);  // the groups, so that children of exited leaders go
}

TEST(WorkerGroupTest, StopWithoutStubbornWorkersEndsBeforeTheGrace) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(group.Start({Request("a"), Request("b")}, absl::Seconds(1)).ok());
  absl::Time start = clock.Now();
  group.Stop(absl::Seconds(30));
  EXPECT_LT(clock.Now() - start, absl::Seconds(1));
}

TEST(WorkerGroupTest, AFailedSpawnStopsTheWorkersAlreadyStarted) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  absl::Status s =
      group.Start({Request("a"), Request("missing")}, absl::Seconds(1));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(control.running().empty());
}

// The slots' pipes are what the plan hands to the workers: starting into
// open slots keeps them, and the worker ends close once the workers run.
TEST(WorkerGroupTest, WorkersStartIntoTheOpenSlotsWithTheirPipes) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  WorkerGroup group(control, clock);
  group.OpenSlots(2);
  ASSERT_EQ(group.size(), 2);
  const int progress_fd = group.slot(1).progress.write_fd();
  const int control_fd = group.slot(1).control.child_fd();
  ASSERT_GE(progress_fd, 0);
  ASSERT_GE(control_fd, 0);
  EXPECT_EQ(group.slot(0).pid, -1);

  ASSERT_TRUE(group.Start({Request("a"), Request("b")}, absl::Seconds(1)).ok());
  EXPECT_EQ(group.slot(0).pid, 100);
  EXPECT_EQ(group.slot(1).pid, 101);
  EXPECT_EQ(group.slot(1).progress.write_fd(), progress_fd);
  group.CloseWorkerEnds();
  EXPECT_EQ(group.slot(1).progress.write_fd(), -1);
  // The number the worker knows its control pipe by stays.
  EXPECT_EQ(group.slot(1).control.child_fd(), control_fd);
}

// Slots without a process yet (a spawn failed before them) are neither
// signalled nor waited for.
TEST(WorkerGroupTest, AFailedStartLeavesNoProcessInTheSlotsAfterIt) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  group.OpenSlots(3);
  absl::Status s = group.Start({Request("a"), Request("missing"), Request("b")},
                               absl::Seconds(1));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(group.AllEnded());
  EXPECT_EQ(group.slot(2).pid, -1);
  for (auto [pid, sig] : control.signals()) EXPECT_EQ(pid, 100);
}

// In-place recovery: the replaced rank's new process starts with fresh
// pipes and has not declared anything yet; its old process's exit, reaped
// later, is dropped.
TEST(WorkerGroupTest, ARespawnedWorkerGetsFreshPipesAndNoDeclaration) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  ActLikeWorkers(control);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(group.Start({Request("a"), Request("b")}, absl::Seconds(1)).ok());
  group.slot(0).declared_in_place = true;
  group.slot(1).declared_in_place = true;
  group.Kill(1);

  group.RenewPipes(1);
  ASSERT_TRUE(group.Respawn(1, Request("b")).ok());

  EXPECT_EQ(group.slot(1).pid, 102);
  EXPECT_FALSE(group.slot(1).declared_in_place);
  EXPECT_TRUE(group.slot(0).declared_in_place);
  EXPECT_GE(group.slot(1).progress.write_fd(), 0);
  EXPECT_NE(group.slot(1).progress.child_fd(), -1);
  EXPECT_TRUE(group.Reap().empty()) << "the killed process is no worker now";
  EXPECT_FALSE(group.Ended(1));
}

// Prewarmed workers come with their own processes and pipes.
TEST(WorkerGroupTest, AdoptedSlotsAreTheWorkers) {
  common::FakeClock clock;
  FakeProcessControl control(&clock, /*first_pid=*/100);
  WorkerGroup group(control, clock);
  pid_t a = *control.Spawn(Request("standby"));
  pid_t b = *control.Spawn(Request("standby"));
  std::vector<WorkerSlot> slots;
  slots.push_back({.pid = a});
  slots.push_back({.pid = b});
  const int fd = slots[1].progress.write_fd();
  group.Adopt(std::move(slots));
  EXPECT_EQ(group.pids(), (std::vector<pid_t>{a, b}));
  EXPECT_EQ(group.slot(1).progress.write_fd(), fd);
  control.End(b, ExitStatus::Exited(0));
  auto exits = group.Reap();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].first, 1);
}

}  // namespace
}  // namespace ddprun::launcher
