// Jobs end cleanly: a finished or abandoned job's state, and its store
// scopes, are released after the grace period, so memory stays flat over
// thousands of jobs. Fake clock, no sockets.
#include <malloc.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/core/store_state.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {
namespace {

class ReleaseTest : public ::testing::Test {
 protected:
  ReleaseTest() : jobs_(&clock_, Options()), store_(&clock_, 1000) {
    spdlog::set_level(spdlog::level::warn);
  }

  static JobTableOptions Options() {
    JobTableOptions options;
    options.ended_job_grace = absl::Seconds(30);
    return options;
  }

  void Apply(Effects effects) {
    answered_ += effects.joins.size();
    for (const auto& r : effects.released) {
      std::vector<StoreCompletion> done;
      store_.ReleaseRoundsBefore(r.run_id, r.before_round, &done);
    }
  }

  // One job's life: two nodes join, write their store keys, and finish
  // (succeed, or fail, or their agents vanish).
  void RunJob(int i) {
    std::string run_id = absl::StrCat("job-", i);
    WaiterId waiters[2];
    for (int n = 0; n < 2; ++n) {
      v1::JoinRequest join;
      join.set_run_id(run_id);
      join.set_node_id(absl::StrCat("node-", n));
      join.set_local_world_size(8);
      join.set_node_rank(-1);
      join.set_address("10.0.0.1");
      join.mutable_config()->set_min_nodes(2);
      join.mutable_config()->set_max_nodes(2);
      waiters[n] = next_waiter_++;
      Effects effects;
      jobs_.Join(join, waiters[n], &effects);
      Apply(std::move(effects));
    }
    v1::StoreScope scope;
    scope.set_run_id(run_id);
    scope.set_round(0);
    std::vector<StoreCompletion> done;
    for (int k = 0; k < 16; ++k) {
      ASSERT_TRUE(store_
                      .Set(scope, absl::StrCat("rank_", k),
                           std::string(128, 'x'), &done)
                      .ok());
    }
    for (int n = 0; n < 2; ++n) {
      Effects effects;
      switch (i % 3) {
        case 0: {  // success
          v1::LeaveRequest leave;
          leave.set_run_id(run_id);
          leave.set_node_id(absl::StrCat("node-", n));
          leave.set_reason(v1::LeaveRequest::REASON_SUCCEEDED);
          ASSERT_TRUE(jobs_.Leave(leave, &effects).ok());
          break;
        }
        case 1: {  // failure with no restarts left
          v1::ReportFailureRequest fail;
          fail.set_run_id(run_id);
          fail.set_node_id(absl::StrCat("node-", n));
          fail.add_failures()->set_message("worker exited 1");
          ASSERT_TRUE(jobs_.ReportFailure(fail, &effects).ok());
          break;
        }
        default:  // abandoned: the agents stop heartbeating
          break;
      }
      Apply(std::move(effects));
    }
  }

  void RunBatch(int first, int count) {
    for (int i = first; i < first + count; ++i) {
      RunJob(i);
      if (HasFatalFailure()) return;
    }
    EXPECT_EQ(jobs_.num_jobs(), static_cast<size_t>(count));
    // Abandoned jobs lose their nodes to the heartbeat timeout first, then
    // wait out the grace period like the others.
    for (int step = 0; step < 8; ++step) {
      clock_.Advance(absl::Seconds(10));
      Effects effects;
      jobs_.Tick(&effects);
      Apply(std::move(effects));
    }
    EXPECT_EQ(jobs_.num_jobs(), 0u);
    EXPECT_EQ(store_.num_scopes(), 0u);
  }

  common::FakeClock clock_;
  JobTable jobs_;
  StoreState store_;
  WaiterId next_waiter_ = 1;
  size_t answered_ = 0;
};

TEST_F(ReleaseTest, MemoryStaysFlatOverThousandsOfJobs) {
  constexpr int kJobs = 3000;
  RunBatch(0, kJobs);  // warms the allocator up
  size_t after_first = mallinfo2().uordblks;
  for (int batch = 1; batch <= 3; ++batch) {
    RunBatch(batch * kJobs, kJobs);
    if (HasFatalFailure()) return;
  }
  size_t after_more = mallinfo2().uordblks;
  EXPECT_EQ(answered_, static_cast<size_t>(4 * kJobs * 2));
  // Each job held ~2 KB of store values plus its nodes; 9000 more jobs
  // leaking would add tens of MB. Allow allocator noise only.
  EXPECT_LT(after_more, after_first + (1 << 20))
      << "heap grew from " << after_first << " to " << after_more << " bytes";
}

TEST_F(ReleaseTest, JobsInUseAreKept) {
  RunJob(1);  // fails: ended
  v1::JoinRequest join;
  join.set_run_id("alive");
  join.set_node_id("a");
  join.set_local_world_size(1);
  join.set_node_rank(-1);
  Effects effects;
  jobs_.Join(join, next_waiter_++, &effects);  // min = max = 1: runs
  Apply(std::move(effects));
  for (int step = 0; step < 10; ++step) {
    clock_.Advance(absl::Seconds(4));
    v1::HeartbeatRequest beat;
    beat.set_run_id("alive");
    beat.set_node_id("a");
    ASSERT_TRUE(jobs_.Heartbeat(beat).ok());
    Effects tick;
    jobs_.Tick(&tick);
    Apply(std::move(tick));
  }
  EXPECT_EQ(jobs_.num_jobs(), 1u) << "only the ended job is released";
  EXPECT_TRUE(jobs_.CurrentRound("alive").has_value());
}

}  // namespace
}  // namespace ddprun::rendezvous
