// The job state machine driven through JobTable with a fake clock: every
// transition, no sockets, no sleeps.
#include "rendezvous/core/job.h"

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"
#include "tests/rendezvous/scale_config.h"

namespace ddprun::rendezvous {
namespace {

using v1::JobState;

class JobTest : public ::testing::Test {
 protected:
  JobTest() : table_(&clock_) {
    config_.set_min_nodes(2);
    config_.set_max_nodes(2);
    config_.set_last_call_timeout_ms(1000);
    config_.set_join_timeout_ms(60000);
    config_.set_heartbeat_interval_ms(100);
    config_.set_heartbeat_timeout_ms(500);
    config_.set_max_restarts(1);
  }

  // Sends a Join; returns its waiter id. Answers land in answers_.
  WaiterId Join(const std::string& node, int node_rank = -1,
                int local_world_size = 1) {
    v1::JoinRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_local_world_size(local_world_size);
    request.set_node_rank(node_rank);
    request.set_address("addr-" + node);
    request.set_master_port(1000 + static_cast<int>(next_waiter_));
    *request.mutable_config() = config_;
    WaiterId id = next_waiter_++;
    waiter_node_[id] = node;
    Effects effects;
    table_.Join(request, id, &effects);
    Absorb(std::move(effects));
    return id;
  }

  void Absorb(Effects effects) {
    for (auto& c : effects.joins) {
      EXPECT_FALSE(answers_.count(c.waiter)) << "answered twice: " << c.waiter;
      answers_.emplace(c.waiter, std::move(c.response));
    }
    for (auto& r : effects.released) released_.push_back(r);
  }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    Effects effects;
    table_.Tick(&effects);
    Absorb(std::move(effects));
  }

  bool Answered(WaiterId id) const { return answers_.count(id) > 0; }
  const v1::Assignment& AssignmentOf(WaiterId id) {
    auto& r = answers_.at(id);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->has_assignment());
    return r->assignment();
  }

  v1::HeartbeatResponse Heartbeat(const std::string& node, int64_t round) {
    v1::HeartbeatRequest request;
    request.set_node_id(node);
    request.set_round(round);
    return Heartbeat(std::move(request));
  }
  // A heartbeat of job "job" with what `request` carries.
  v1::HeartbeatResponse Heartbeat(v1::HeartbeatRequest request) {
    request.set_run_id("job");
    absl::StatusOr<v1::HeartbeatResponse> response = table_.Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::HeartbeatResponse();
  }

  v1::ReportFailureResponse Fail(const std::string& node, int64_t round,
                                 int rank = 0) {
    v1::ReportFailureRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_round(round);
    auto* f = request.add_failures();
    f->set_rank(rank);
    f->set_exit_code(3);
    f->set_cause("exited");
    Effects effects;
    auto response = table_.ReportFailure(request, &effects);
    Absorb(std::move(effects));
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  }

  void Leave(const std::string& node, int64_t round,
             v1::LeaveRequest::Reason reason) {
    v1::LeaveRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_round(round);
    request.set_reason(reason);
    Effects effects;
    EXPECT_TRUE(table_.Leave(request, &effects).ok());
    Absorb(std::move(effects));
  }

  v1::JobStatus Status() {
    v1::StatusRequest request;
    request.set_run_id("job");
    auto response = table_.Status(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response->jobs(0);
  }

  // Forms round 0 with nodes a and b (min = max = 2).
  void FormFirstRound() {
    WaiterId a = Join("a");
    WaiterId b = Join("b");
    ASSERT_TRUE(Answered(a) && Answered(b));
    ASSERT_EQ(AssignmentOf(a).round(), 0);
  }

  common::FakeClock clock_;
  JobTable table_;
  v1::JobConfig config_;
  WaiterId next_waiter_ = 1;
  std::map<WaiterId, std::string> waiter_node_;
  std::map<WaiterId, absl::StatusOr<v1::JoinResponse>> answers_;
  std::vector<ReleasedRounds> released_;
};

TEST_F(JobTest, FirstRoundClosesAtMaxWithConsistentAssignments) {
  WaiterId a = Join("a", -1, 2);
  EXPECT_FALSE(Answered(a)) << "one of two nodes must wait";
  WaiterId b = Join("b", -1, 3);
  ASSERT_TRUE(Answered(a));
  ASSERT_TRUE(Answered(b));
  const v1::Assignment& x = AssignmentOf(a);
  const v1::Assignment& y = AssignmentOf(b);
  EXPECT_EQ(x.round(), 0);
  EXPECT_EQ(x.node_rank(), 0);  // arrival order
  EXPECT_EQ(y.node_rank(), 1);
  EXPECT_EQ(x.rank_offset(), 0);
  EXPECT_EQ(y.rank_offset(), 2);
  EXPECT_EQ(x.world_size(), 5);
  EXPECT_EQ(y.world_size(), 5);
  EXPECT_EQ(x.num_nodes(), 2);
  EXPECT_EQ(x.master_addr(), "addr-a");
  EXPECT_EQ(y.master_addr(), "addr-a");
  EXPECT_EQ(x.master_port(), y.master_port());
  EXPECT_EQ(x.master_port(), 1000 + static_cast<int>(a));
  ASSERT_EQ(x.peers_size(), 2);
  EXPECT_EQ(x.peers(1).node_id(), "b");
  EXPECT_EQ(x.peers(1).rank_offset(), 2);
  EXPECT_EQ(x.heartbeat_interval_ms(), 100);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobTest, ElasticRoundClosesAtMinAfterLastCall) {
  config_.set_min_nodes(2);
  config_.set_max_nodes(4);
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  EXPECT_FALSE(Answered(a));
  Advance(absl::Milliseconds(999));
  EXPECT_FALSE(Answered(a)) << "last call is not over";
  WaiterId c = Join("c");  // a third node inside the window is included
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Answered(a) && Answered(b) && Answered(c));
  EXPECT_EQ(AssignmentOf(c).num_nodes(), 3);
  EXPECT_EQ(AssignmentOf(c).node_rank(), 2);
}

TEST_F(JobTest, ElasticRoundClosesAtMaxWithoutWaitingForLastCall) {
  config_.set_min_nodes(1);
  config_.set_max_nodes(3);
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  EXPECT_FALSE(Answered(a));
  WaiterId c = Join("c");
  EXPECT_TRUE(Answered(a) && Answered(b) && Answered(c));
}

TEST_F(JobTest, RestartIsFastWhenEveryExpectedNodeRejoins) {
  config_.set_min_nodes(1);
  config_.set_max_nodes(3);
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  Advance(absl::Milliseconds(1000));
  ASSERT_TRUE(Answered(a) && Answered(b));
  EXPECT_EQ(Fail("b", 0).restart_count(), 1);
  EXPECT_TRUE(Heartbeat("a", 0).rejoin());
  WaiterId b2 = Join("b");
  EXPECT_FALSE(Answered(b2)) << "a is still expected";
  WaiterId a2 = Join("a");
  // Both previous members are back: no last-call wait.
  ASSERT_TRUE(Answered(a2) && Answered(b2));
  EXPECT_EQ(AssignmentOf(a2).round(), 1);
  EXPECT_EQ(AssignmentOf(a2).node_rank(), 0) << "previous order is kept";
  EXPECT_EQ(AssignmentOf(b2).node_rank(), 1);
  EXPECT_EQ(AssignmentOf(b2).restart_count(), 1);
}

TEST_F(JobTest, NewNodeWhileRunningEndsTheRoundAndIsAppended) {
  config_.set_min_nodes(2);
  config_.set_max_nodes(3);
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  Advance(absl::Milliseconds(1000));
  ASSERT_TRUE(Answered(a) && Answered(b));
  WaiterId c = Join("c");
  EXPECT_FALSE(Answered(c));
  v1::HeartbeatResponse hb = Heartbeat("a", 0);
  EXPECT_TRUE(hb.rejoin());
  EXPECT_EQ(hb.nodes_waiting(), 1);
  EXPECT_EQ(hb.round(), 1);
  ASSERT_EQ(released_.size(), 1u);
  EXPECT_EQ(released_[0].before_round, 1);
  WaiterId b2 = Join("b");
  WaiterId a2 = Join("a");
  ASSERT_TRUE(Answered(c) && Answered(a2) && Answered(b2));
  EXPECT_EQ(AssignmentOf(a2).node_rank(), 0);
  EXPECT_EQ(AssignmentOf(b2).node_rank(), 1);
  EXPECT_EQ(AssignmentOf(c).node_rank(), 2);
  EXPECT_EQ(AssignmentOf(c).restart_count(), 0) << "membership is no restart";
}

TEST_F(JobTest, NewNodeWaitsWhenTheRoundIsFull) {
  FormFirstRound();
  WaiterId c = Join("c");
  EXPECT_FALSE(Answered(c));
  v1::HeartbeatResponse hb = Heartbeat("a", 0);
  EXPECT_FALSE(hb.rejoin()) << "a full round keeps running";
  EXPECT_EQ(hb.nodes_waiting(), 1);
  EXPECT_EQ(Status().round(), 0);
}

TEST_F(JobTest, MemberJoiningAgainEndsTheRoundWithoutRestart) {
  FormFirstRound();
  WaiterId a2 = Join("a");
  EXPECT_FALSE(Answered(a2));
  EXPECT_TRUE(Heartbeat("b", 0).rejoin());
  WaiterId b2 = Join("b");
  ASSERT_TRUE(Answered(a2) && Answered(b2));
  EXPECT_EQ(AssignmentOf(a2).round(), 1);
  EXPECT_EQ(AssignmentOf(a2).restart_count(), 0);
}

TEST_F(JobTest, SilentMemberIsDroppedAndSurvivorsWaitForMin) {
  FormFirstRound();
  Advance(absl::Milliseconds(300));
  EXPECT_FALSE(Heartbeat("a", 0).rejoin());
  Advance(absl::Milliseconds(300));  // b silent 600 ms > 500 ms
  v1::HeartbeatResponse hb = Heartbeat("a", 0);
  EXPECT_TRUE(hb.rejoin());
  EXPECT_EQ(hb.round(), 1);
  EXPECT_EQ(Status().nodes_size(), 1);
  WaiterId a2 = Join("a");
  Advance(absl::Seconds(5));
  EXPECT_FALSE(Answered(a2)) << "1 node < min 2: wait for more";
  WaiterId d = Join("d");
  ASSERT_TRUE(Answered(a2) && Answered(d));
  EXPECT_EQ(AssignmentOf(a2).node_rank(), 0);
  EXPECT_EQ(AssignmentOf(d).node_rank(), 1);
  EXPECT_EQ(AssignmentOf(d).restart_count(), 0);
}

// A member whose heartbeat stream ended (its agent was killed: the kernel
// closes its connection) and that then sends nothing is dropped after the
// stream-loss grace (a second here), not the whole heartbeat timeout: a
// restarted agent waiting to take its place is not kept waiting.
TEST_F(JobTest, AMemberGoneWithItsHeartbeatStreamIsDroppedWithinASecond) {
  config_.set_heartbeat_interval_ms(250);
  config_.set_heartbeat_timeout_ms(10000);
  FormFirstRound();
  Advance(absl::Milliseconds(100));
  Heartbeat("b", 0);
  table_.HeartbeatStreamEnded("job", "b", 0);
  WaiterId c = Join("c");  // b's agent, started again
  Advance(absl::Milliseconds(999));
  Heartbeat("a", 0);
  EXPECT_EQ(Status().round(), 0) << "within the grace";
  EXPECT_FALSE(Answered(c));
  Advance(absl::Milliseconds(1));
  EXPECT_TRUE(Heartbeat("a", 0).rejoin());
  WaiterId a2 = Join("a");
  ASSERT_TRUE(Answered(a2) && Answered(c));
  EXPECT_EQ(AssignmentOf(c).round(), 1);
  EXPECT_EQ(AssignmentOf(c).restart_count(), 0) << "a lost node, no restart";
}

// An agent whose stream broke but that lives sends a unary heartbeat at its
// next beat: it stays; and a stream that ends after its round ended (the
// agent moves to the next round) changes nothing.
TEST_F(JobTest, AMemberThatBeatsAfterItsStreamEndedStays) {
  config_.set_heartbeat_interval_ms(250);
  config_.set_heartbeat_timeout_ms(10000);
  FormFirstRound();
  table_.HeartbeatStreamEnded("job", "b", 0);
  Advance(absl::Milliseconds(250));
  Heartbeat("b", 0);  // unary, at its next beat
  Heartbeat("a", 0);
  Advance(absl::Seconds(2));
  Heartbeat("a", 0);
  Heartbeat("b", 0);
  EXPECT_EQ(Status().round(), 0);
  table_.HeartbeatStreamEnded("job", "a", 7);  // not the running round
  Advance(absl::Seconds(2));
  EXPECT_FALSE(Heartbeat("b", 0).rejoin());
}

TEST_F(JobTest, ScaleDownClosesFastWithTheSurvivors) {
  config_.set_min_nodes(1);
  config_.set_max_nodes(3);
  Join("a");
  Join("b");
  Join("c");
  Advance(absl::Milliseconds(300));
  Heartbeat("a", 0);
  Heartbeat("b", 0);
  Advance(absl::Milliseconds(300));  // c is lost
  EXPECT_TRUE(Heartbeat("a", 0).rejoin());
  WaiterId a2 = Join("a");
  EXPECT_FALSE(Answered(a2));
  WaiterId b2 = Join("b");
  ASSERT_TRUE(Answered(a2) && Answered(b2)) << "no last-call wait";
  EXPECT_EQ(AssignmentOf(b2).num_nodes(), 2);
}

TEST_F(JobTest, FailuresCountOncePerRoundAndExhaust) {
  FormFirstRound();
  v1::ReportFailureResponse r = Fail("a", 0, 0);
  EXPECT_EQ(r.restart_count(), 1);
  EXPECT_FALSE(r.restarts_exhausted());
  r = Fail("b", 0, 1);  // same incident seen by the other agent
  EXPECT_EQ(r.restart_count(), 1);
  EXPECT_EQ(Status().failures_size(), 2) << "both records kept";
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  ASSERT_TRUE(Answered(a) && Answered(b));
  EXPECT_EQ(AssignmentOf(a).restart_count(), 1);
  EXPECT_EQ(AssignmentOf(a).round(), 1);
  r = Fail("b", 1, 1);
  EXPECT_EQ(r.restart_count(), 2);
  EXPECT_TRUE(r.restarts_exhausted());
  v1::HeartbeatResponse hb = Heartbeat("a", 1);
  ASSERT_TRUE(hb.has_ended());
  EXPECT_EQ(hb.ended().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(hb.ended().failures(0).round(), 0) << "root cause first";
  EXPECT_EQ(hb.ended().failures(0).node_id(), "a");
  WaiterId late = Join("c");
  ASSERT_TRUE(Answered(late));
  ASSERT_TRUE(answers_.at(late).ok());
  EXPECT_EQ(answers_.at(late)->ended().state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobTest, ParkedJoinsLearnTheJobFailed) {
  config_.set_max_restarts(0);
  FormFirstRound();
  WaiterId c = Join("c");  // waits: the round is full
  Fail("a", 0);
  ASSERT_TRUE(Answered(c));
  EXPECT_EQ(answers_.at(c)->ended().state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobTest, FailureForAnOldRoundChangesNothing) {
  FormFirstRound();
  Fail("a", 0);
  Join("a");
  Join("b");
  EXPECT_EQ(Fail("a", 7).restart_count(), 1);
  EXPECT_EQ(Status().round(), 1);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobTest, SucceedsWhenEveryMemberLeftSucceeded) {
  FormFirstRound();
  Leave("a", 0, v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(Heartbeat("b", 0).rejoin());
  Leave("b", 0, v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  WaiterId late = Join("c");
  EXPECT_EQ(answers_.at(late)->ended().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobTest, LeaveShutdownEndsTheRoundWithoutRestart) {
  config_.set_min_nodes(1);
  config_.set_max_nodes(2);
  FormFirstRound();
  Leave("b", 0, v1::LeaveRequest::REASON_SHUTDOWN);
  EXPECT_TRUE(Heartbeat("a", 0).rejoin());
  WaiterId a2 = Join("a");
  ASSERT_TRUE(Answered(a2)) << "a is all that is expected";
  EXPECT_EQ(AssignmentOf(a2).num_nodes(), 1);
  EXPECT_EQ(AssignmentOf(a2).restart_count(), 0);
}

TEST_F(JobTest, JoinTimesOutWithDeadlineExceeded) {
  WaiterId a = Join("a");
  Advance(absl::Milliseconds(59999));
  EXPECT_FALSE(Answered(a));
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Answered(a));
  EXPECT_EQ(answers_.at(a).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(answers_.at(a).status().message().find("min_nodes is 2"),
            std::string::npos)
      << answers_.at(a).status();
  EXPECT_EQ(Status().nodes_size(), 0);
}

TEST_F(JobTest, CancelledJoinDropsTheNode) {
  WaiterId a = Join("a");
  Effects effects;
  table_.CancelJoin("job", "a", a, &effects);
  EXPECT_TRUE(effects.joins.empty()) << "the adapter answers a cancel itself";
  WaiterId b = Join("b");
  EXPECT_FALSE(Answered(b)) << "a is gone, so b alone cannot close";
}

TEST_F(JobTest, SecondJoinFromTheSameNodeSupersedesTheFirst) {
  WaiterId a = Join("a");
  WaiterId a2 = Join("a");
  ASSERT_TRUE(Answered(a));
  EXPECT_EQ(answers_.at(a).status().code(), absl::StatusCode::kAborted);
  WaiterId b = Join("b");
  EXPECT_TRUE(Answered(a2) && Answered(b));
}

TEST_F(JobTest, NodeRanksAreKeptAndDuplicatesRefused) {
  config_.set_min_nodes(3);
  config_.set_max_nodes(3);
  WaiterId x = Join("x", 2);
  WaiterId dup = Join("y", 2);
  ASSERT_TRUE(Answered(dup));
  EXPECT_EQ(answers_.at(dup).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answers_.at(dup).status().message().find("'x'"), std::string::npos);
  WaiterId big = Join("z", 3);
  EXPECT_EQ(answers_.at(big).status().code(),
            absl::StatusCode::kInvalidArgument);
  WaiterId y = Join("y");
  WaiterId w = Join("w", 0);
  ASSERT_TRUE(Answered(x) && Answered(y) && Answered(w));
  EXPECT_EQ(AssignmentOf(x).node_rank(), 2);
  EXPECT_EQ(AssignmentOf(w).node_rank(), 0);
  EXPECT_EQ(AssignmentOf(y).node_rank(), 1);
  EXPECT_EQ(AssignmentOf(y).master_addr(), "addr-w");
}

TEST_F(JobTest, ConfigMismatchIsRefusedNamingTheField) {
  WaiterId a = Join("a");
  config_.set_max_restarts(5);
  WaiterId b = Join("b");
  ASSERT_TRUE(Answered(b));
  EXPECT_EQ(answers_.at(b).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answers_.at(b).status().message().find("max_restarts=1"),
            std::string::npos)
      << answers_.at(b).status();
  EXPECT_FALSE(Answered(a));
}

TEST_F(JobTest, ConfigDefaultsFillZeros) {
  config_ = v1::JobConfig();
  WaiterId a = Join("a");
  ASSERT_TRUE(Answered(a)) << "min = max = 1 by default";
  v1::JobConfig c = Status().config();
  EXPECT_EQ(c.min_nodes(), 1);
  EXPECT_EQ(c.max_nodes(), 1);
  EXPECT_GT(c.join_timeout_ms(), 0);
  EXPECT_GT(c.heartbeat_timeout_ms(), c.heartbeat_interval_ms());
}

TEST_F(JobTest, BadConfigIsRefused) {
  config_.set_min_nodes(3);
  config_.set_max_nodes(2);
  WaiterId a = Join("a");
  EXPECT_EQ(answers_.at(a).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.num_jobs(), 0u);
}

TEST_F(JobTest, StoreScopeOfAnOldRoundIsRefused) {
  v1::StoreScope scope;
  scope.set_run_id("job");
  scope.set_round(0);
  EXPECT_TRUE(table_.CheckStoreScope(scope).ok()) << "no job: free-standing";
  FormFirstRound();
  EXPECT_TRUE(table_.CheckStoreScope(scope).ok());
  Fail("a", 0);
  absl::Status stale = table_.CheckStoreScope(scope);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("round 0 is over; the job is in round 1"),
            std::string::npos)
      << stale;
  scope.set_round(1);
  EXPECT_TRUE(table_.CheckStoreScope(scope).ok());
}

TEST_F(JobTest, EndedJobIsReleasedAfterTheGracePeriod) {
  FormFirstRound();
  Leave("a", 0, v1::LeaveRequest::REASON_SUCCEEDED);
  Leave("b", 0, v1::LeaveRequest::REASON_SUCCEEDED);
  Advance(absl::Minutes(4));
  EXPECT_EQ(table_.num_jobs(), 1u);
  Advance(absl::Minutes(1));
  EXPECT_EQ(table_.num_jobs(), 0u);
}

TEST_F(JobTest, StatusShowsRestartsAndFailures) {
  FormFirstRound();
  Fail("b", 0, 1);
  v1::JobStatus s = Status();
  EXPECT_EQ(s.restart_count(), 1);
  EXPECT_EQ(s.round(), 1);
  EXPECT_EQ(s.state(), v1::JOB_STATE_JOINING);
  ASSERT_EQ(s.failures_size(), 1);
  EXPECT_EQ(s.failures(0).node_id(), "b");
  EXPECT_EQ(s.failures(0).rank(), 1);
  EXPECT_EQ(s.failures(0).exit_code(), 3);
  EXPECT_GT(s.failures(0).time_unix_ms(), 0);
  for (const auto& node : s.nodes()) {
    EXPECT_EQ(node.state(), "rejoining") << node.node_id();
    EXPECT_EQ(node.node_rank(), -1);
  }
  WaiterId a = Join("a");
  EXPECT_FALSE(Answered(a));
  EXPECT_EQ(Status().nodes(0).state(), "joining");
}

TEST_F(JobTest, StatusShowsNodesRanksAndAges) {
  FormFirstRound();
  Advance(absl::Milliseconds(200));
  Heartbeat("a", 0);
  v1::JobStatus s = Status();
  ASSERT_EQ(s.nodes_size(), 2);
  EXPECT_EQ(s.nodes(0).node_id(), "a");
  EXPECT_EQ(s.nodes(0).state(), "running");
  EXPECT_EQ(s.nodes(0).last_heartbeat_age_ms(), 0);
  EXPECT_EQ(s.nodes(1).node_rank(), 1);
  EXPECT_EQ(s.nodes(1).last_heartbeat_age_ms(), 200);
  EXPECT_EQ(s.world_size(), 2);
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

// Forms round 0 of a job of `nodes` nodes; returns the assignments.
std::vector<v1::Assignment> FormRound(Job& job, int nodes, absl::Time now) {
  Effects effects;
  for (int i = 0; i < nodes; ++i) {
    v1::JoinRequest request;
    request.set_run_id(job.run_id());
    request.set_node_id("n" + std::to_string(i));
    request.set_local_world_size(1);
    request.set_node_rank(-1);
    request.set_address("addr");
    job.Join(request, static_cast<WaiterId>(i + 1), now, &effects);
  }
  std::vector<v1::Assignment> assignments;
  for (auto& c : effects.joins) {
    EXPECT_TRUE(c.response.ok()) << c.response.status();
    if (c.response.ok()) assignments.push_back(c.response->assignment());
  }
  return assignments;
}

TEST(HeartbeatBudgetTest, ALargeJobIsToldALongerIntervalAndTimeout) {
  JobOptions options;
  options.heartbeat_budget_per_s = 20;  // 10 nodes at 100 ms would send 100/s
  absl::Time now = absl::UnixEpoch();
  Job job("big", ScaleConfig(10), now, options);
  std::vector<v1::Assignment> assignments = FormRound(job, 10, now);
  ASSERT_EQ(assignments.size(), 10u);
  for (const v1::Assignment& a : assignments) {
    EXPECT_EQ(a.heartbeat_interval_ms(), 500) << "10 nodes / 20 per s";
    EXPECT_EQ(a.heartbeat_timeout_ms(), 2500) << "in proportion: 5 x 500 ms";
  }
  // Nine nodes beat at the longer interval; n9 beats once as the round
  // starts and is silent after it. The job's own 500 ms timeout would have
  // dropped them all; the lengthened one drops only n9, once 2.5 s passed.
  Effects effects;
  v1::HeartbeatRequest once;
  once.set_node_id("n9");
  job.Heartbeat(once, now);
  for (absl::Duration t :
       {absl::Milliseconds(500), absl::Milliseconds(1000),
        absl::Milliseconds(1500), absl::Milliseconds(2000)}) {
    for (int i = 0; i < 9; ++i) {
      v1::HeartbeatRequest beat;
      beat.set_node_id("n" + std::to_string(i));
      EXPECT_FALSE(job.Heartbeat(beat, now + t).rejoin());
    }
    job.Tick(now + t, &effects);
  }
  job.Tick(now + absl::Milliseconds(2400), &effects);
  EXPECT_EQ(job.round(), 0) << "no live node was declared lost";
  job.Tick(now + absl::Milliseconds(2600), &effects);
  EXPECT_EQ(job.round(), 1) << "the silent node is lost after 2.5 s";
}

// A member never heard from in its round (its agent died after its Join
// was answered, before its first heartbeat: no stream whose end tells) is
// dropped after the first-beat grace (4 intervals, at least 2 s), not after
// the whole heartbeat timeout.
TEST(HeartbeatTimeoutTest, AMemberNeverHeardInItsRoundIsDroppedSooner) {
  absl::Time now = absl::UnixEpoch();
  v1::JobConfig config = ScaleConfig(2);
  config.set_heartbeat_interval_ms(250);
  config.set_heartbeat_timeout_ms(10000);
  Job job("first-beat", config, now, JobOptions{});
  ASSERT_EQ(FormRound(job, 2, now).size(), 2u);
  Effects effects;
  for (int ms = 250; ms <= 1750; ms += 250) {
    v1::HeartbeatRequest beat;
    beat.set_node_id("n0");
    beat.set_round(job.round());
    job.Heartbeat(beat, now + absl::Milliseconds(ms));
    job.Tick(now + absl::Milliseconds(ms), &effects);
  }
  EXPECT_EQ(job.round(), 0) << "within the grace";
  v1::HeartbeatRequest beat;
  beat.set_node_id("n0");
  job.Heartbeat(beat, now + absl::Milliseconds(2000));
  job.Tick(now + absl::Milliseconds(2000), &effects);
  EXPECT_EQ(job.round(), 1) << "n1 was never heard in round 0: dropped at 2 s";
  // A member heard once in its round waits out the heartbeat timeout.
  Job heard("heard", config, now, JobOptions{});
  ASSERT_EQ(FormRound(heard, 2, now).size(), 2u);
  for (const char* id : {"n0", "n1"}) {
    v1::HeartbeatRequest first;
    first.set_node_id(id);
    heard.Heartbeat(first, now + absl::Milliseconds(250));
  }
  for (int ms = 500; ms <= 9000; ms += 500) {
    v1::HeartbeatRequest alive;
    alive.set_node_id("n0");
    heard.Heartbeat(alive, now + absl::Milliseconds(ms));
    heard.Tick(now + absl::Milliseconds(ms), &effects);
  }
  EXPECT_EQ(heard.round(), 0) << "n1 was heard: the 10 s timeout applies";
}

TEST(HeartbeatBudgetTest, JobsWithinTheBudgetKeepTheirInterval) {
  JobOptions options;
  options.heartbeat_budget_per_s = 20;
  absl::Time now = absl::UnixEpoch();
  Job small("small", ScaleConfig(2), now, options);  // 20/s: at the budget
  for (const v1::Assignment& a : FormRound(small, 2, now)) {
    EXPECT_EQ(a.heartbeat_interval_ms(), 100);
    EXPECT_EQ(a.heartbeat_timeout_ms(), 500);
  }
  options.heartbeat_budget_per_s = 0;  // never lengthened
  Job unbounded("unbounded", ScaleConfig(10), now, options);
  for (const v1::Assignment& a : FormRound(unbounded, 10, now)) {
    EXPECT_EQ(a.heartbeat_interval_ms(), 100);
    EXPECT_EQ(a.heartbeat_timeout_ms(), 500);
  }
}

TEST(FiguresBudgetTest, ALargeJobIsToldToSendItsFiguresLessOften) {
  absl::Time now = absl::UnixEpoch();
  // Within the default budget: once a second.
  Job small("small", ScaleConfig(10), now);
  for (const v1::Assignment& a : FormRound(small, 10, now)) {
    EXPECT_EQ(a.figures_interval_ms(), 1000);
  }
  // 10 nodes at 5 figures messages/s: every 2 s; the heartbeats keep
  // their own interval.
  JobOptions options;
  options.figures_budget_per_s = 5;
  Job big("big", ScaleConfig(10), now, options);
  std::vector<v1::Assignment> assignments = FormRound(big, 10, now);
  ASSERT_EQ(assignments.size(), 10u);
  for (const v1::Assignment& a : assignments) {
    EXPECT_EQ(a.figures_interval_ms(), 2000);
    EXPECT_EQ(a.heartbeat_interval_ms(), 100);
  }
}

v1::HeartbeatRequest Beat(const std::string& node, int64_t round = 0) {
  v1::HeartbeatRequest beat;
  beat.set_node_id(node);
  beat.set_round(round);
  return beat;
}

// Tick skips its scan of the nodes until a deadline may be due; a silent
// member is still lost at the first tick past its deadline, not later.
TEST(HeartbeatClockTest, SilentMemberIsLostAtTheFirstTickPastItsDeadline) {
  absl::Time t0 = absl::UnixEpoch();
  Job job("job", ScaleConfig(2), t0);  // interval 100 ms, timeout 500 ms
  ASSERT_EQ(FormRound(job, 2, t0).size(), 2u);
  Effects effects;
  absl::Time n1_last = t0;
  for (int ms = 10; ms <= 2000; ms += 10) {
    absl::Time now = t0 + absl::Milliseconds(ms);
    job.Heartbeat(Beat("n0"), now);
    if (ms <= 300) {
      job.Heartbeat(Beat("n1"), now);
      n1_last = now;
    }
    job.Tick(now, &effects);
    if (now < n1_last + absl::Milliseconds(500)) {
      ASSERT_EQ(job.round(), 0) << "n1 lost early, at " << ms << " ms";
    } else {
      ASSERT_EQ(job.round(), 1) << "n1 not lost at " << ms << " ms";
      return;
    }
  }
  FAIL() << "n1 was never lost";
}

// Handing out a large round's answers takes the server seconds: a member's
// heartbeat clock starts when its answer went out, not at the close.
TEST(HeartbeatClockTest, ClocksStartWhenTheAnswersWereHandedOut) {
  absl::Time t0 = absl::UnixEpoch();
  Job job("job", ScaleConfig(2), t0);
  Effects closed;
  for (int i = 0; i < 2; ++i) {
    v1::JoinRequest request;
    request.set_node_id("n" + std::to_string(i));
    request.set_local_world_size(1);
    request.set_node_rank(-1);
    job.Join(request, static_cast<WaiterId>(i + 1), t0, &closed);
  }
  ASSERT_EQ(closed.closed.size(), 1u) << "the close is an effect";
  EXPECT_EQ(closed.closed[0].run_id, "job");
  EXPECT_EQ(closed.closed[0].round, 0);
  const absl::Time delivered = t0 + absl::Seconds(2);
  job.AnswersDelivered(0, delivered);
  Effects effects;
  job.Tick(delivered + absl::Milliseconds(450), &effects);
  EXPECT_EQ(job.round(), 0)
      << "2 s after the close, but only 450 ms after the answers";
  job.Heartbeat(Beat("n0"), delivered + absl::Milliseconds(450));
  job.Tick(delivered + absl::Milliseconds(550), &effects);
  EXPECT_EQ(job.round(), 1) << "n1 never beat: lost 500 ms after its answer";
  // A delivery report for a round that is over changes nothing.
  job.AnswersDelivered(0, delivered + absl::Seconds(10));
  EXPECT_EQ(job.round(), 1);
}

// A node of a batched Join whose assignment waits in the batch (another
// node of it waits for a later round) is not silent until the batch was
// answered; from then its clock runs as any member's.
TEST(HeartbeatClockTest, AnAssignmentHeldInABatchIsNotSilence) {
  absl::Time t0 = absl::UnixEpoch();
  Job job("job", ScaleConfig(1), t0);  // one node per round, timeout 500 ms
  Effects effects;
  for (int i = 0; i < 2; ++i) {
    v1::JoinRequest request;
    request.set_node_id("n" + std::to_string(i));
    request.set_local_world_size(1);
    request.set_node_rank(-1);
    job.Join(request, static_cast<WaiterId>(i + 1), t0, &effects,
             /*in_batch=*/true);
  }
  ASSERT_EQ(effects.joins.size(), 1u) << "n0 closes round 0, n1 waits";
  ASSERT_TRUE(effects.joins[0].response.ok());
  ASSERT_TRUE(effects.joins[0].response->has_assignment());
  job.AnswersDelivered(0, t0);  // (the round's clock alone would run now)
  Effects later;
  job.Tick(t0 + absl::Seconds(5), &later);
  EXPECT_EQ(job.round(), 0) << "n0's answer is still held by its batch";
  const absl::Time sent = t0 + absl::Seconds(6);
  job.HeldAnswersDelivered({"n0"}, sent);
  job.Tick(sent + absl::Milliseconds(450), &later);
  EXPECT_EQ(job.round(), 0) << "450 ms after the batch was answered";
  job.Tick(sent + absl::Milliseconds(550), &later);
  EXPECT_EQ(job.round(), 1) << "n0 never beat: lost 500 ms after its answer";
}

// Nodes of a batched Join hold no call: they do not count against
// max_parked_joins and are parked, never answered `waiting` for it.
TEST(PollJoinBatchTest, BatchedNodesTakeNoParkedSlot) {
  absl::Time t0 = absl::UnixEpoch();
  JobOptions options;
  options.max_parked_joins = 1;
  Job job("job", ScaleConfig(4), t0, options);
  auto join = [&](const std::string& node, WaiterId waiter, bool in_batch) {
    v1::JoinRequest request;
    request.set_node_id(node);
    request.set_local_world_size(1);
    request.set_node_rank(-1);
    request.set_poll(true);
    Effects effects;
    job.Join(request, waiter, t0, &effects, in_batch);
    return effects;
  };
  for (int i = 0; i < 3; ++i) {
    Effects effects = join("b" + std::to_string(i), i + 1, /*in_batch=*/true);
    EXPECT_TRUE(effects.joins.empty()) << "b" << i << " is parked";
  }
  // The one parked slot is still free for a single polling Join.
  Effects single = join("s0", 10, /*in_batch=*/false);
  ASSERT_EQ(single.joins.size(), 4u) << "s0 parked and the round closed";
  for (const JoinCompletion& c : single.joins) {
    ASSERT_TRUE(c.response.ok());
    EXPECT_TRUE(c.response->has_assignment()) << c.waiter;
  }
  // Past the cap, a single polling Join waits by polling.
  Effects past = join("s1", 11, /*in_batch=*/false);
  EXPECT_TRUE(past.joins.empty()) << "s1 takes the free parked slot";
  Effects past2 = join("s2", 12, /*in_batch=*/false);
  ASSERT_EQ(past2.joins.size(), 1u);
  ASSERT_TRUE(past2.joins[0].response.ok());
  EXPECT_TRUE(past2.joins[0].response->has_waiting());
}

// The server did not run for a second (overloaded or paused): the
// heartbeats sent meanwhile wait in its queues behind the first Tick after
// the stall. That Tick must not declare the nodes lost.
TEST(HeartbeatClockTest, TheServersOwnStallIsNotCountedAsSilence) {
  for (bool forgive : {true, false}) {
    SCOPED_TRACE(forgive ? "stalls forgiven" : "stalls counted");
    JobOptions options;
    if (forgive) options.forgive_stalls_over = absl::Milliseconds(200);
    absl::Time t0 = absl::UnixEpoch();
    Job job("job", ScaleConfig(2), t0, options);
    ASSERT_EQ(FormRound(job, 2, t0).size(), 2u);
    Effects effects;
    absl::Time now = t0;
    for (int i = 0; i < 10; ++i) {
      now += absl::Milliseconds(10);
      job.Heartbeat(Beat("n0"), now);
      job.Heartbeat(Beat("n1"), now);
      job.Tick(now, &effects);
    }
    now += absl::Seconds(1);  // no tick, no heartbeat handled
    job.Tick(now, &effects);
    if (!forgive) {
      EXPECT_EQ(job.round(), 1) << "the control: counted, the stall loses both";
      continue;
    }
    EXPECT_EQ(job.round(), 0) << "a live node was declared lost";
    job.Heartbeat(Beat("n0"), now);  // the queued heartbeats
    job.Heartbeat(Beat("n1"), now);
    // After the stall n1 goes silent for real: it is still lost.
    absl::Time n1_last = now;
    while (job.round() == 0 && now < n1_last + absl::Seconds(2)) {
      now += absl::Milliseconds(10);
      job.Heartbeat(Beat("n0"), now);
      job.Tick(now, &effects);
    }
    EXPECT_EQ(job.round(), 1);
    EXPECT_GE(now, n1_last + absl::Milliseconds(500));
    EXPECT_LE(now, n1_last + absl::Milliseconds(510));
  }
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

// A heartbeat of `node` in round 0 of "job" with the figures of its one
// rank, stepping at `compute_s` per step.
v1::HeartbeatRequest FiguresBeat(const std::string& node, double compute_s) {
  v1::HeartbeatRequest request;
  request.set_run_id("job");
  request.set_node_id(node);
  request.set_round(0);
  v1::RankFigures* r = request.add_ranks();
  r->set_local_rank(0);
  r->set_phase("step");
  r->set_steps(100);
  r->set_samples(20);
  r->set_compute_mean_s(compute_s);
  return request;
}

// Rank figures in heartbeats name a straggler in Status, and the job's
// events tell the round, the straggler and a failure with its cause.
TEST_F(JobTest, HeartbeatFiguresNameAStragglerInStatusAndEvents) {
  FormFirstRound();
  auto beat = [&](const std::string& node, double compute_s) {
    ASSERT_TRUE(table_.Heartbeat(FiguresBeat(node, compute_s)).ok());
  };
  for (int i = 0; i < 5; ++i) {
    beat("a", 0.010);
    beat("b", 0.030);
    clock_.Advance(absl::Seconds(1));
  }
  v1::JobStatus status = Status();
  ASSERT_EQ(status.stragglers_size(), 1);
  EXPECT_EQ(status.stragglers(0).node_id(), "b");
  EXPECT_EQ(status.stragglers(0).rank(), 1);
  EXPECT_NEAR(status.stragglers(0).ratio(), 3, 1e-9);
  ASSERT_EQ(status.nodes(1).ranks_size(), 1);
  EXPECT_EQ(status.nodes(1).ranks(0).phase(), "step");
  EXPECT_EQ(status.events_size(), 0) << "only when asked";
  // Its agent hears it in the heartbeat's answer; the other's does not.
  v1::HeartbeatResponse b_answer = Heartbeat("b", 0);
  ASSERT_EQ(b_answer.straggler_local_ranks_size(), 1);
  EXPECT_EQ(b_answer.straggler_local_ranks(0), 0);
  EXPECT_EQ(Heartbeat("a", 0).straggler_local_ranks_size(), 0);

  Fail("a", 0, 0);
  v1::StatusRequest request;
  request.set_run_id("job");
  request.set_events(true);
  auto response = table_.Status(request);
  ASSERT_TRUE(response.ok());
  std::vector<std::string> kinds;
  for (const v1::JobEvent& e : response->jobs(0).events()) {
    kinds.push_back(e.kind());
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"round", "straggler", "failure",
                                             "restart"}));
  EXPECT_EQ(response->jobs(0).events(2).rank(), 0);
  EXPECT_NE(response->jobs(0).events(2).message().find("exited"),
            std::string::npos);
  EXPECT_EQ(response->jobs(0).stragglers_size(), 0) << "the round ended";
}

// A large job's nodes send figures every few seconds (figures_interval_ms);
// the straggler windows still pass once a second, on the heartbeats
// between: figures sent once name the straggler after three windows, not
// after three figures messages.
TEST_F(JobTest, StragglerWindowsPassOnHeartbeatsWithoutFigures) {
  FormFirstRound();
  ASSERT_TRUE(table_.Heartbeat(FiguresBeat("a", 0.010)).ok());
  ASSERT_TRUE(table_.Heartbeat(FiguresBeat("b", 0.030)).ok());
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat("a", 0);
    Heartbeat("b", 0);
  }
  v1::JobStatus status = Status();
  ASSERT_EQ(status.stragglers_size(), 1);
  EXPECT_EQ(status.stragglers(0).node_id(), "b");
}

// Every heartbeat carries the most steps of its node's ranks; the answer
// carries the round's most (an agent's rank one behind it is waited for),
// never less than it was, and none once the round is over.
TEST_F(JobTest, AnswersTheRoundsMostStepsUntilTheRoundIsOver) {
  FormFirstRound();
  auto beat = [&](const std::string& node, int64_t round, int64_t steps) {
    v1::HeartbeatRequest request;
    request.set_node_id(node);
    request.set_round(round);
    request.set_steps(steps);
    return Heartbeat(std::move(request));
  };
  EXPECT_EQ(beat("a", 0, 0).round_steps(), 0);
  EXPECT_EQ(beat("b", 0, 7).round_steps(), 7);
  EXPECT_EQ(beat("a", 0, 6).round_steps(), 7);
  EXPECT_EQ(beat("b", 0, 5).round_steps(), 7) << "never less";
  EXPECT_EQ(beat("a", 0, 9).round_steps(), 9);
  EXPECT_EQ(beat("b", 5, 90).round_steps(), 0) << "not its round";
  EXPECT_EQ(beat("a", 0, 9).round_steps(), 9);
  Fail("a", 0, 0);
  const v1::HeartbeatResponse over = beat("b", 0, 10);
  EXPECT_TRUE(over.rejoin());
  EXPECT_EQ(over.round_steps(), 0);
}

// The heartbeats also say how far their node's ranks got through the
// round's state sync; the answer carries the round's furthest, dated by the
// first rank there, apart from the steps, and a new round starts it again.
TEST_F(JobTest, AnswersTheRoundsFurthestInTheSyncUntilTheNextRound) {
  FormFirstRound();
  auto beat = [&](const std::string& node, int64_t round, int64_t sync,
                  int64_t age_ms) {
    v1::HeartbeatRequest request;
    request.set_node_id(node);
    request.set_round(round);
    request.set_sync(sync);
    request.set_sync_age_ms(age_ms);
    return Heartbeat(std::move(request));
  };
  v1::HeartbeatResponse r = beat("a", 0, 0, 0);
  EXPECT_EQ(r.round_sync(), 0);
  EXPECT_EQ(r.round_sync_age_ms(), 0);
  r = beat("b", 0, 2, 300);
  EXPECT_EQ(r.round_sync(), 2);
  EXPECT_EQ(r.round_sync_age_ms(), 300);
  EXPECT_EQ(r.round_steps(), 0) << "the sync is not steps";
  Advance(absl::Milliseconds(100));
  r = beat("a", 0, 1, 0);
  EXPECT_EQ(r.round_sync(), 2) << "never less";
  EXPECT_EQ(r.round_sync_age_ms(), 400);
  r = beat("a", 0, 3, 20);
  EXPECT_EQ(r.round_sync(), 3);
  EXPECT_EQ(r.round_sync_age_ms(), 20);
  Fail("a", 0, 0);
  EXPECT_EQ(beat("b", 0, 4, 0).round_sync(), 0) << "its round is over";
  WaiterId a = Join("a");
  WaiterId b = Join("b");
  ASSERT_TRUE(Answered(a) && Answered(b));
  const int64_t next = AssignmentOf(a).round();
  ASSERT_GT(next, 0);
  r = beat("a", next, 0, 0);
  EXPECT_FALSE(r.rejoin());
  EXPECT_EQ(r.round_sync(), 0) << "a new round's sync starts again";
  EXPECT_EQ(beat("b", next, 1, 0).round_sync(), 1);
}

// The round's most steps are dated by when the first rank got there, as
// its agent said (steps_age_ms), and answered with their age: an agent
// times its rank behind from then, not from when the answer came.
TEST_F(JobTest, AnswersHowLongAgoTheFirstRankGotToTheMostSteps) {
  FormFirstRound();
  auto beat = [&](const std::string& node, int64_t steps, int64_t age_ms) {
    v1::HeartbeatRequest request;
    request.set_node_id(node);
    request.set_round(0);
    request.set_steps(steps);
    request.set_steps_age_ms(age_ms);
    return Heartbeat(std::move(request));
  };
  v1::HeartbeatResponse r = beat("a", 7, 120);
  EXPECT_EQ(r.round_steps(), 7);
  EXPECT_EQ(r.round_steps_age_ms(), 120);
  Advance(absl::Milliseconds(100));
  r = beat("b", 7, 30);  // b got there later than a
  EXPECT_EQ(r.round_steps_age_ms(), 220);
  r = beat("b", 7, 400);  // b says it got there before a: it waited longest
  EXPECT_EQ(r.round_steps_age_ms(), 400);
  Advance(absl::Milliseconds(50));
  EXPECT_EQ(beat("a", 6, 0).round_steps_age_ms(), 450) << "behind: no news";
  r = beat("a", 8, -5);  // a negative age (a confused agent) counts as 0
  EXPECT_EQ(r.round_steps(), 8);
  EXPECT_EQ(r.round_steps_age_ms(), 0);
  Advance(absl::Milliseconds(10));
  EXPECT_EQ(beat("b", 7, 0).round_steps_age_ms(), 10);
}

TEST(JobEventsTest, KeepsTheFirstAndTheLatest) {
  JobEvents events(/*max_events=*/4, /*keep_first=*/1);
  for (int i = 0; i < 10; ++i) {
    events.Add(absl::UnixEpoch(), "round", i, -1, "");
  }
  ASSERT_EQ(events.events().size(), 4u);
  EXPECT_EQ(events.events()[0].round(), 0);
  EXPECT_EQ(events.events()[1].round(), 7);
  EXPECT_EQ(events.events()[3].round(), 9);
  EXPECT_EQ(events.dropped(), 6);
}

}  // namespace
}  // namespace ddprun::rendezvous
