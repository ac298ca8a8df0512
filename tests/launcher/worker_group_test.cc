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

}  // namespace
}  // namespace ddprun::launcher
