// A rendezvous restart, decided with a fake clock: a job formed on one
// JobTable (the server before the restart) is learned again by a fresh
// JobTable (the restarted server) from the records agents carry: Resume for
// a round whose workers still run, Join with a record for a round that is
// over. No sockets, no sleeps.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rendezvous_words.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"

namespace ddprun::rendezvous {
namespace {

class JobResumeTest : public ::testing::Test {
 protected:
  JobResumeTest() : table_(std::make_unique<JobTable>(&clock_)) {
    config_.set_min_nodes(2);
    config_.set_max_nodes(2);
    config_.set_last_call_timeout_ms(1000);
    config_.set_join_timeout_ms(60000);
    config_.set_heartbeat_interval_ms(100);
    config_.set_heartbeat_timeout_ms(500);
    config_.set_max_restarts(2);
  }

  v1::JoinRequest Request(const std::string& node, int local_world_size) {
    v1::JoinRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_local_world_size(local_world_size);
    request.set_node_rank(-1);
    request.set_address("addr-" + node);
    request.set_master_port(2000);
    *request.mutable_config() = config_;
    return request;
  }

  // The record an agent keeps of `node`'s last assignment.
  v1::RoundRecord Record(const std::string& node) {
    v1::RoundRecord record;
    *record.mutable_assignment() = assignments_.at(node);
    record.set_restart_count(assignments_.at(node).restart_count());
    return record;
  }

  // A Join; the answer lands in answers_[waiter]. With `record`, as an
  // agent sends it after a round it ran.
  WaiterId Join(const std::string& node, int local_world_size = 1,
                const v1::RoundRecord* record = nullptr) {
    local_world_size_[node] = local_world_size;
    v1::JoinRequest request = Request(node, local_world_size);
    if (record != nullptr) *request.mutable_record() = *record;
    WaiterId id = next_waiter_++;
    Effects effects;
    table_->Join(request, id, &effects);
    Absorb(std::move(effects));
    return id;
  }

  void Absorb(Effects effects) {
    for (auto& c : effects.joins) answers_.emplace(c.waiter, c.response);
  }

  // Remembers each answered Join's assignment, as the agents do.
  void Assigned(WaiterId id, const std::string& node) {
    ASSERT_TRUE(answers_.count(id)) << node << " was not answered";
    ASSERT_TRUE(answers_.at(id).ok()) << answers_.at(id).status();
    ASSERT_TRUE(answers_.at(id)->has_assignment());
    assignments_[node] = answers_.at(id)->assignment();
  }

  v1::ResumeResponse Resume(const std::string& node,
                            const v1::RoundRecord& record) {
    v1::JoinRequest request = Request(
        node, local_world_size_.count(node) ? local_world_size_[node] : 1);
    *request.mutable_record() = record;
    Effects effects;
    absl::StatusOr<v1::ResumeResponse> response =
        table_->Resume(request, &effects);
    Absorb(std::move(effects));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.value_or(v1::ResumeResponse());
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& node,
                                                  int64_t round) {
    v1::HeartbeatRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_round(round);
    return table_->Heartbeat(request);
  }

  v1::ReportFailureResponse Fail(const std::string& node, int64_t round) {
    v1::ReportFailureRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_round(round);
    v1::WorkerFailure* f = request.add_failures();
    f->set_exit_code(3);
    f->set_failure_cause(v1::FAILURE_CAUSE_EXITED);
    Effects effects;
    auto response = table_->ReportFailure(request, &effects);
    Absorb(std::move(effects));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.value_or(v1::ReportFailureResponse());
  }

  void Leave(const std::string& node, int64_t round) {
    v1::LeaveRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_round(round);
    request.set_reason(v1::LeaveRequest::REASON_SUCCEEDED);
    Effects effects;
    EXPECT_TRUE(table_->Leave(request, &effects).ok());
    Absorb(std::move(effects));
  }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    Effects effects;
    table_->Tick(&effects);
    Absorb(std::move(effects));
  }

  v1::JobStatus Status() {
    v1::StatusRequest request;
    request.set_run_id("job");
    auto response = table_->Status(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->jobs(0) : v1::JobStatus();
  }

  // Round 0 of a (2 ranks) and b (1 rank), then a failure: round 1 runs
  // with restart count 1. The agents' records hold round 1.
  void RunUntilRoundOneAfterAFailure() {
    WaiterId a = Join("a", 2);
    WaiterId b = Join("b", 1);
    Assigned(a, "a");
    Assigned(b, "b");
    ASSERT_EQ(Fail("b", 0).restart_count(), 1);
    v1::RoundRecord ra = Record("a");
    v1::RoundRecord rb = Record("b");
    WaiterId a1 = Join("a", 2, &ra);
    WaiterId b1 = Join("b", 1, &rb);
    Assigned(a1, "a");
    Assigned(b1, "b");
    ASSERT_EQ(assignments_["a"].round(), 1);
    ASSERT_EQ(assignments_["a"].restart_count(), 1);
  }

  // kill -9 of the server, started again: a table that knows nothing.
  void RestartServer() {
    table_ = std::make_unique<JobTable>(&clock_);
    answers_.clear();
  }

  common::FakeClock clock_;
  std::unique_ptr<JobTable> table_;
  v1::JobConfig config_;
  WaiterId next_waiter_ = 1;
  std::map<WaiterId, absl::StatusOr<v1::JoinResponse>> answers_;
  std::map<std::string, v1::Assignment> assignments_;
  std::map<std::string, int> local_world_size_;
};

TEST_F(JobResumeTest, ARestartedServerResumesTheRoundFromTheMembersRecords) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  // The agents' next heartbeats find no job: they resume with their records.
  absl::StatusOr<v1::HeartbeatResponse> unknown = Heartbeat("a", 1);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  v1::ResumeResponse ra = Resume("a", Record("a"));
  ASSERT_TRUE(ra.has_assignment()) << ra.rejoin();
  EXPECT_EQ(ra.assignment().round(), 1);
  EXPECT_EQ(ra.assignment().node_rank(), assignments_["a"].node_rank());
  EXPECT_EQ(ra.assignment().restart_count(), 1);
  v1::JobStatus resuming = Status();
  EXPECT_EQ(resuming.round(), 1);
  EXPECT_EQ(resuming.restart_count(), 1);
  EXPECT_EQ(resuming.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(resuming.resuming());

  // b has not re-registered yet: its heartbeat says resume, not rejoin.
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("b", 1);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->resume());
  EXPECT_FALSE(hb->rejoin());
  v1::ResumeResponse rb = Resume("b", Record("b"));
  ASSERT_TRUE(rb.has_assignment()) << rb.rejoin();
  EXPECT_EQ(rb.assignment().rank_offset(), assignments_["b"].rank_offset());

  // The round runs on: no rejoin, past the resume deadline too.
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Milliseconds(100));
    for (const char* node : {"a", "b"}) {
      absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat(node, 1);
      ASSERT_TRUE(beat.ok());
      EXPECT_FALSE(beat->rejoin()) << node;
      EXPECT_FALSE(beat->resume()) << node;
    }
  }
  v1::JobStatus status = Status();
  EXPECT_FALSE(status.resuming()) << "whole again";
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(status.world_size(), 3);
  ASSERT_EQ(status.nodes_size(), 2);
  for (const v1::NodeStatus& node : status.nodes()) {
    EXPECT_EQ(node.node_state(), v1::NODE_STATE_RUNNING) << node.node_id();
    EXPECT_EQ(node.state(), "running");
  }
  EXPECT_EQ(status.nodes(0).node_id(),
            assignments_["a"].node_rank() == 0 ? "a" : "b");
}

TEST_F(JobResumeTest, TheRestartBudgetHoldsAcrossARestart) {
  config_.set_max_restarts(1);
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  // The second failure is one too many, as it would have been without the
  // restart.
  v1::ReportFailureResponse failed = Fail("a", 1);
  EXPECT_EQ(failed.restart_count(), 2);
  EXPECT_TRUE(failed.restarts_exhausted());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobResumeTest, AFailureAfterTheRestartStartsTheNextRoundCounted) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  EXPECT_EQ(Fail("b", 1).restart_count(), 2);
  v1::RoundRecord ra = Record("a");
  v1::RoundRecord rb = Record("b");
  WaiterId a2 = Join("a", 2, &ra);
  WaiterId b2 = Join("b", 1, &rb);
  Assigned(a2, "a");
  Assigned(b2, "b");
  EXPECT_EQ(assignments_["a"].round(), 2);
  EXPECT_EQ(assignments_["b"].restart_count(), 2);
}

TEST_F(JobResumeTest, JoinsWithRecordsContinueTheRoundsAndTheCount) {
  // The server restarted between rounds: the agents were Joining.
  RunUntilRoundOneAfterAFailure();
  ASSERT_EQ(Fail("a", 1).restart_count(), 2);
  v1::RoundRecord ra = Record("a");
  ra.set_restart_count(2);           // the ReportFailure's answer
  v1::RoundRecord rb = Record("b");  // b heard only of round 1's count
  RestartServer();
  WaiterId b2 = Join("b", 1, &rb);
  WaiterId a2 = Join("a", 2, &ra);
  Assigned(a2, "a");
  Assigned(b2, "b");
  EXPECT_EQ(assignments_["a"].round(), 2);
  EXPECT_EQ(assignments_["a"].restart_count(), 2) << "the highest count wins";
  EXPECT_EQ(assignments_["b"].restart_count(), 2);
}

TEST_F(JobResumeTest, AFailureNoServerAcknowledgedStillCounts) {
  config_.set_max_restarts(1);
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  // a's worker failed while the server was down: its ReportFailure failed.
  v1::RoundRecord ra = Record("a");
  ra.set_failed(true);
  WaiterId a2 = Join("a", 2, &ra);
  ASSERT_TRUE(answers_.count(a2));
  ASSERT_TRUE(answers_.at(a2).ok());
  ASSERT_TRUE(answers_.at(a2)->has_ended());
  EXPECT_EQ(answers_.at(a2)->ended().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Status().restart_count(), 2);
}

TEST_F(JobResumeTest, TheHighestRoundWinsAndOlderRecordsRejoin) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  v1::RoundRecord old_a = Record("a");
  old_a.mutable_assignment()->set_round(0);
  ASSERT_TRUE(Resume("a", old_a).has_assignment()) << "round 0 is rebuilt";
  // b's record says round 1: it replaces the round being rebuilt.
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  EXPECT_EQ(Status().round(), 1);
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("a", 0);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->rejoin()) << "a's round 0 is over";
  v1::ResumeResponse again = Resume("a", old_a);
  EXPECT_FALSE(again.rejoin().empty());
  EXPECT_FALSE(again.has_assignment());
}

TEST_F(JobResumeTest, ADisagreeingRecordIsToldToRejoin) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  // c claims a's node rank in round 1.
  v1::ResumeResponse taken = Resume("c", Record("a"));
  EXPECT_NE(taken.rejoin().find("already held by node 'a'"), std::string::npos)
      << taken.rejoin();
  // b's record disagrees on the size of the round.
  v1::RoundRecord other = Record("b");
  other.mutable_assignment()->set_num_nodes(3);
  v1::ResumeResponse size = Resume("b", other);
  EXPECT_NE(size.rejoin().find("3 nodes"), std::string::npos) << size.rejoin();
}

TEST_F(JobResumeTest, RanksThatDoNotTileTheWorldEndTheRound) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  local_world_size_["a"] = 1;  // a now says 1 rank; its record says 2
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("b", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->rejoin()) << "the resumed round cannot be trusted";
  EXPECT_EQ(hb->round(), 2);
  EXPECT_EQ(Status().restart_count(), 1);
}

TEST_F(JobResumeTest, ResumingTwiceGivesTheSameAnswer) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  v1::ResumeResponse retry = Resume("b", Record("b"));
  ASSERT_TRUE(retry.has_assignment()) << retry.rejoin();
  EXPECT_EQ(retry.assignment().round(), 1);
}

TEST_F(JobResumeTest, AMissingMemberEndsTheRoundWithoutARestart) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  // b never comes back; a heartbeats on.
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Milliseconds(100));
    ASSERT_FALSE(Heartbeat("a", 1)->rejoin());
  }
  Advance(absl::Milliseconds(100));  // the round's heartbeat timeout
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("a", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->rejoin());
  EXPECT_EQ(hb->round(), 2);
  EXPECT_EQ(Status().restart_count(), 1) << "a lost node is no restart";
}

// b's workers all succeeded while the server was down. Its agent tells the
// restarted server with a Resume (its record) and then a Leave: the round
// rebuilt from a's record does not wait for b, and a's success ends the
// job, with no new round and no restart of a's workers.
TEST_F(JobResumeTest, ANodeThatFinishedWhileTheServerWasDownResumesThenLeaves) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  Leave("b", 1);
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  EXPECT_FALSE(Status().resuming()) << "whole again";
  // Past the resume deadline and the heartbeat timeout: a runs on.
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Milliseconds(100));
    absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("a", 1);
    ASSERT_TRUE(beat.ok());
    EXPECT_FALSE(beat->rejoin());
  }
  EXPECT_EQ(Status().round(), 1);
  Leave("a", 1);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(status.restart_count(), 1);
}

// b saw round 1 end just before the server died (its round is over: it
// joins for the next one, its record naming round 1). The server rebuilding
// round 1 from a's record ends it at b's Join, not after the heartbeat
// timeout, and both go on in round 2 without a restart.
TEST_F(JobResumeTest, AMemberThatJoinsAnewEndsTheRebuildAtOnce) {
  RunUntilRoundOneAfterAFailure();
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  ASSERT_TRUE(Status().resuming());
  v1::RoundRecord rb = Record("b");
  WaiterId b = Join("b", 1, &rb);
  EXPECT_FALSE(Status().resuming());
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("a", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->rejoin()) << "no wait for the heartbeat timeout";
  v1::RoundRecord ra = Record("a");
  WaiterId a = Join("a", 2, &ra);
  Assigned(a, "a");
  Assigned(b, "b");
  EXPECT_EQ(assignments_["a"].round(), 2);
  EXPECT_EQ(Status().restart_count(), 1) << "a round change, no restart";
}

TEST_F(JobResumeTest, AJoinWhileResumingWaitsForTheRoundToBeWhole) {
  config_.set_max_nodes(3);
  config_.set_min_nodes(2);
  WaiterId a = Join("a", 2);
  WaiterId b = Join("b", 1);
  Advance(absl::Milliseconds(1000));  // last call
  Assigned(a, "a");
  Assigned(b, "b");
  RestartServer();
  ASSERT_TRUE(Resume("a", Record("a")).has_assignment());
  WaiterId c = Join("c", 1);
  EXPECT_FALSE(answers_.count(c));
  EXPECT_FALSE(Heartbeat("a", 0)->rejoin()) << "c waits for the rebuild";
  ASSERT_TRUE(Resume("b", Record("b")).has_assignment());
  // Whole again: c is admitted as into any running round.
  EXPECT_TRUE(Heartbeat("a", 0)->rejoin());
}

TEST(RendezvousWordsTest, EnumsReadAsTheWordsOfTheOlderStringFields) {
  EXPECT_EQ(common::FailureCauseWord(v1::FAILURE_CAUSE_HUNG), "hung");
  EXPECT_EQ(common::FailureCauseFromWord("signaled"),
            v1::FAILURE_CAUSE_SIGNALED);
  EXPECT_EQ(common::FailureCauseFromWord("bogus"),
            v1::FAILURE_CAUSE_UNSPECIFIED);
  EXPECT_EQ(common::NodeStateWord(v1::NODE_STATE_REJOINING), "rejoining");
  EXPECT_EQ(common::NodeStateWord(static_cast<v1::NodeState>(99)),
            "unspecified");
  v1::WorkerFailure old_agent;
  old_agent.set_cause("spawn");
  common::NormalizeFailureCause(old_agent);
  EXPECT_EQ(old_agent.failure_cause(), v1::FAILURE_CAUSE_SPAWN);
  v1::WorkerFailure new_agent;
  new_agent.set_failure_cause(v1::FAILURE_CAUSE_EXITED);
  common::NormalizeFailureCause(new_agent);
  EXPECT_EQ(new_agent.cause(), "exited");
}

}  // namespace
}  // namespace ddprun::rendezvous
