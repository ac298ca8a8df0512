#include "launcher/posix/worker_group.h"

#include <signal.h>

#include <deque>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

// Processes that exist only in memory: SIGTERM ends those that do not ignore
// it, SIGKILL ends all, and waiting advances the fake clock.
class FakeProcessControl : public ProcessControl {
 public:
  explicit FakeProcessControl(common::FakeClock& clock) : clock_(clock) {}

  absl::StatusOr<pid_t> Spawn(const SpawnRequest& request) override {
    if (request.argv.at(0) == "missing") {
      return absl::FailedPreconditionError("cannot run 'missing'");
    }
    pid_t pid = next_pid_++;
    running_.insert(pid);
    if (request.argv.at(0) == "stubborn") stubborn_.insert(pid);
    spawned_.push_back(request);
    return pid;
  }
  void SignalGroup(pid_t pgid, int sig) override {
    signals_.push_back({pgid, sig});
    if (!running_.count(pgid)) return;
    if (sig == SIGKILL || (sig == SIGTERM && !stubborn_.count(pgid))) {
      End(pgid, ExitStatus::Signaled(sig));
    }
  }
  std::optional<std::pair<pid_t, ExitStatus>> ReapAny() override {
    if (ended_.empty()) return std::nullopt;
    auto e = ended_.front();
    ended_.pop_front();
    return e;
  }
  void AwaitChildEvent(absl::Duration max) override { clock_.Advance(max); }

  void End(pid_t pid, ExitStatus status) {
    running_.erase(pid);
    ended_.push_back({pid, status});
  }

  std::vector<std::pair<pid_t, int>> signals_;
  std::vector<SpawnRequest> spawned_;
  std::set<pid_t> running_;

 private:
  common::FakeClock& clock_;
  pid_t next_pid_ = 100;
  std::set<pid_t> stubborn_;
  std::deque<std::pair<pid_t, ExitStatus>> ended_;
};

SpawnRequest Request(const std::string& program) {
  SpawnRequest r;
  r.argv = {program};
  return r;
}

TEST(WorkerGroupTest, ReapMapsPidsToLocalRanksAndDropsGrandchildren) {
  common::FakeClock clock;
  FakeProcessControl control(clock);
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
  FakeProcessControl control(clock);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(
      group
          .Start({Request("polite"), Request("stubborn"), Request("stubborn")},
                 absl::Seconds(1))
          .ok());
  absl::Time start = clock.Now();
  auto exits = group.Stop(absl::Seconds(3));
  EXPECT_TRUE(group.AllEnded());
  EXPECT_TRUE(control.running_.empty());
  ASSERT_EQ(exits.size(), 3u);
  // One grace for all, not one per worker.
  EXPECT_GE(clock.Now() - start, absl::Seconds(3));
  EXPECT_LT(clock.Now() - start, absl::Seconds(4));
  int terms = 0, kills = 0;
  for (auto [pid, sig] : control.signals_) {
    terms += sig == SIGTERM;
    kills += sig == SIGKILL;
  }
  EXPECT_EQ(terms, 3);
  EXPECT_EQ(kills, 3);  // the groups, so that children of exited leaders go
}

TEST(WorkerGroupTest, StopWithoutStubbornWorkersEndsBeforeTheGrace) {
  common::FakeClock clock;
  FakeProcessControl control(clock);
  WorkerGroup group(control, clock);
  ASSERT_TRUE(group.Start({Request("a"), Request("b")}, absl::Seconds(1)).ok());
  absl::Time start = clock.Now();
  group.Stop(absl::Seconds(30));
  EXPECT_LT(clock.Now() - start, absl::Seconds(1));
}

TEST(WorkerGroupTest, AFailedSpawnStopsTheWorkersAlreadyStarted) {
  common::FakeClock clock;
  FakeProcessControl control(clock);
  WorkerGroup group(control, clock);
  absl::Status s =
      group.Start({Request("a"), Request("missing")}, absl::Seconds(1));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(control.running_.empty());
}

}  // namespace
}  // namespace ddprun::launcher
