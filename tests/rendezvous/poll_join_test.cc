// Polling Join (JoinRequest.poll) in the job state machine, with time passed
// in: past JobOptions::max_parked_joins a Join is answered `waiting` and its
// node polls; older agents' Joins are always parked.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/core/job.h"
#include "tests/rendezvous/scale_config.h"

namespace ddprun::rendezvous {
namespace {

// Drives one Job: sends Joins as agents would and keeps every answer.
class PollJoinTest : public ::testing::Test {
 protected:
  void Make(int nodes, int64_t max_parked_joins,
            v1::JobConfig config = v1::JobConfig()) {
    options_.max_parked_joins = max_parked_joins;
    options_.poll.min_interval = absl::Milliseconds(250);
    options_.poll.min_timeout = absl::ZeroDuration();
    if (config.min_nodes() == 0) config = ScaleConfig(nodes);
    job_ = std::make_unique<Job>("job", config, now_, options_);
  }

  // Sends node `node`'s Join; returns its waiter id. Answers land in
  // answers_ (polls are answered at once; parked calls later).
  WaiterId Join(const std::string& node, bool poll = true) {
    v1::JoinRequest request;
    request.set_run_id("job");
    request.set_node_id(node);
    request.set_local_world_size(2);
    request.set_node_rank(-1);
    request.set_address("addr-" + node);
    request.set_poll(poll);
    WaiterId id = next_waiter_++;
    Effects effects;
    job_->Join(request, id, now_, &effects);
    Absorb(std::move(effects));
    return id;
  }

  void Absorb(Effects effects) {
    for (auto& c : effects.joins) {
      EXPECT_FALSE(answers_.count(c.waiter)) << "answered twice: " << c.waiter;
      answers_.emplace(c.waiter, std::move(c.response));
    }
  }

  void Advance(absl::Duration d) {
    now_ += d;
    Effects effects;
    job_->Tick(now_, &effects);
    Absorb(std::move(effects));
  }

  bool Answered(WaiterId id) const { return answers_.count(id) > 0; }
  bool Waiting(WaiterId id) const {
    auto it = answers_.find(id);
    return it != answers_.end() && it->second.ok() && it->second->has_waiting();
  }
  const v1::Assignment& AssignmentOf(WaiterId id) {
    auto& r = answers_.at(id);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->has_assignment()) << r->DebugString();
    return r->assignment();
  }

  JobOptions options_;
  absl::Time now_ = absl::UnixEpoch();
  std::unique_ptr<Job> job_;
  WaiterId next_waiter_ = 1;
  std::map<WaiterId, absl::StatusOr<v1::JoinResponse>> answers_;
};

TEST_F(PollJoinTest, JoinsPastTheParkedCapWaitThenCollectTheirAssignments) {
  Make(5, /*max_parked_joins=*/2);
  WaiterId n0 = Join("n0");
  WaiterId n1 = Join("n1");
  EXPECT_FALSE(Answered(n0)) << "within the cap: parked, as before";
  EXPECT_FALSE(Answered(n1));
  WaiterId n2 = Join("n2");
  WaiterId n3 = Join("n3");
  ASSERT_TRUE(Waiting(n2)) << "past the cap: answered waiting at once";
  ASSERT_TRUE(Waiting(n3));
  const v1::JoinWaiting& w = answers_.at(n3)->waiting();
  EXPECT_EQ(w.round(), 0);
  EXPECT_EQ(w.poll_interval_ms(), 250);
  EXPECT_EQ(w.poll_timeout_ms(), 250 + 500) << "an interval + the job's "
                                               "heartbeat timeout";
  EXPECT_EQ(w.nodes_waiting(), 4);
  EXPECT_EQ(job_->Status(now_).nodes_size(), 4);

  // The fifth Join closes the round: the parked calls are answered, the
  // polling Join that closed it gets its assignment at once.
  WaiterId n4 = Join("n4");
  std::set<int> ranks;
  for (WaiterId id : {n0, n1, n4}) {
    ASSERT_TRUE(Answered(id));
    ranks.insert(AssignmentOf(id).node_rank());
  }
  // The others collect theirs at their next poll.
  now_ += absl::Milliseconds(250);
  WaiterId n2_again = Join("n2");
  WaiterId n3_again = Join("n3");
  for (WaiterId id : {n2_again, n3_again}) {
    ASSERT_TRUE(Answered(id));
    ranks.insert(AssignmentOf(id).node_rank());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4}));
  for (WaiterId id : {n0, n1, n2_again, n3_again, n4}) {
    EXPECT_EQ(AssignmentOf(id).world_size(), 10);
    EXPECT_EQ(AssignmentOf(id).round(), 0);
  }
  EXPECT_EQ(job_->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job_->round(), 0) << "collecting is not a second Join";
}

TEST_F(PollJoinTest, JoinsWithoutPollAreAlwaysParked) {
  Make(3, /*max_parked_joins=*/0);  // no polling Join may park
  WaiterId n0 = Join("n0", /*poll=*/false);
  WaiterId n1 = Join("n1", /*poll=*/false);
  EXPECT_FALSE(Answered(n0)) << "an older agent's Join is parked";
  EXPECT_FALSE(Answered(n1));
  WaiterId n2 = Join("n2", /*poll=*/false);
  for (WaiterId id : {n0, n1, n2}) EXPECT_EQ(AssignmentOf(id).round(), 0);
}

TEST_F(PollJoinTest, PollIntervalGrowsWithThePollingNodes) {
  Make(100, /*max_parked_joins=*/0);
  options_.poll.budget_per_s = 10;
  job_ = std::make_unique<Job>("job", ScaleConfig(100), now_, options_);
  std::vector<WaiterId> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(Join("n" + std::to_string(i)));
  ASSERT_TRUE(Waiting(ids.front()));
  EXPECT_EQ(answers_.at(ids.front())->waiting().poll_interval_ms(), 250)
      << "one node: the minimum";
  ASSERT_TRUE(Waiting(ids.back()));
  EXPECT_EQ(answers_.at(ids.back())->waiting().poll_interval_ms(), 2000)
      << "20 polling nodes within 10 polls/s";
  EXPECT_EQ(answers_.at(ids.back())->waiting().poll_timeout_ms(), 2000 + 4000)
      << "an interval + two (longer than the heartbeat timeout)";
}

TEST_F(PollJoinTest, ANodeThatStopsPollingIsDropped) {
  Make(3, /*max_parked_joins=*/0);
  ASSERT_TRUE(Waiting(Join("n0")));
  ASSERT_TRUE(Waiting(Join("n1")));
  // n0 polls every 250 ms; n1 never again. Its timeout: 250 + 500 ms.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Milliseconds(250));
    ASSERT_TRUE(Waiting(Join("n0")));
  }
  ASSERT_EQ(job_->Status(now_).nodes_size(), 1) << "n1 is dropped at 750 ms";
  EXPECT_EQ(job_->Status(now_).nodes(0).node_id(), "n0");
  EXPECT_EQ(job_->Status(now_).nodes(0).node_state(), v1::NODE_STATE_JOINING);
  // n1's next poll is a new Join: it waits again, as a newcomer.
  WaiterId back = Join("n1");
  EXPECT_TRUE(Waiting(back));
  EXPECT_EQ(answers_.at(back)->waiting().nodes_waiting(), 2);
}

TEST_F(PollJoinTest, JoinTimeoutRunsFromTheFirstPoll) {
  v1::JobConfig config = ScaleConfig(2);
  config.set_join_timeout_ms(1000);
  Make(2, /*max_parked_joins=*/0, config);
  ASSERT_TRUE(Waiting(Join("n0")));
  WaiterId last = 0;
  for (int i = 0; i < 3; ++i) {  // polls at 250, 500, 750 ms
    Advance(absl::Milliseconds(250));
    last = Join("n0");
    ASSERT_TRUE(Waiting(last)) << "polls do not extend join_timeout";
  }
  Advance(absl::Milliseconds(250));  // 1000 ms: timed out
  WaiterId timed_out = Join("n0");
  ASSERT_TRUE(Answered(timed_out));
  EXPECT_EQ(answers_.at(timed_out).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(answers_.at(timed_out).status().message().find("join_timeout"),
            std::string::npos);
  EXPECT_EQ(job_->Status(now_).nodes_size(), 0) << "dropped once told";
}

TEST_F(PollJoinTest, HeartbeatClockStartsWhenTheAssignmentIsCollected) {
  Make(2, /*max_parked_joins=*/0);
  ASSERT_TRUE(Waiting(Join("n0")));
  WaiterId n1 = Join("n1");  // closes the round, answered at once
  ASSERT_EQ(AssignmentOf(n1).round(), 0);
  // n0 collects its assignment 600 ms later, past the 500 ms heartbeat
  // timeout counted from the close; it is not lost.
  for (int i = 0; i < 6; ++i) {
    Advance(absl::Milliseconds(100));
    v1::HeartbeatRequest beat;
    beat.set_node_id("n1");
    job_->Heartbeat(beat, now_);
  }
  ASSERT_EQ(job_->round(), 0);
  WaiterId n0 = Join("n0");
  ASSERT_EQ(AssignmentOf(n0).round(), 0);
  Advance(absl::Milliseconds(400));
  EXPECT_EQ(job_->round(), 0) << "400 ms after n0 collected: not silent yet";
  Advance(absl::Milliseconds(200));
  EXPECT_EQ(job_->round(), 1) << "n0 never beat: lost 500 ms after collecting";
}

TEST_F(PollJoinTest, AMemberThatNeverCollectsItsAssignmentEndsTheRound) {
  Make(2, /*max_parked_joins=*/0);
  ASSERT_TRUE(Waiting(Join("n0")));
  ASSERT_EQ(AssignmentOf(Join("n1")).round(), 0);
  for (int i = 0; i < 8; ++i) {
    Advance(absl::Milliseconds(100));
    v1::HeartbeatRequest beat;
    beat.set_node_id("n1");
    beat.set_round(0);
    job_->Heartbeat(beat, now_);
    if (now_ < absl::UnixEpoch() + absl::Milliseconds(750)) {
      ASSERT_EQ(job_->round(), 0) << "n0's poll timeout is 750 ms";
    }
  }
  EXPECT_EQ(job_->round(), 1) << "n0 did not poll within its timeout";
  EXPECT_EQ(job_->restart_count(), 0) << "a lost node is not a restart";
}

// The server gives a large fan-out's memory back only once no decision
// waits for its polling node (MemoryReturn): the count follows every way a
// waiting decision goes (collected, the node dropped, superseded).
TEST_F(PollJoinTest, CountsTheDecisionsWaitingForTheirPolls) {
  Make(4, /*max_parked_joins=*/0);
  ASSERT_TRUE(Waiting(Join("n0")));
  ASSERT_TRUE(Waiting(Join("n1")));
  ASSERT_TRUE(Waiting(Join("n2")));
  EXPECT_EQ(job_->answers_for_poll(), 0) << "nothing decided yet";
  ASSERT_EQ(AssignmentOf(Join("n3")).round(), 0) << "n3 closes the round";
  EXPECT_EQ(job_->answers_for_poll(), 3);
  now_ += absl::Milliseconds(250);
  ASSERT_EQ(AssignmentOf(Join("n0")).round(), 0);
  EXPECT_EQ(job_->answers_for_poll(), 2) << "n0 collected its assignment";
  // n1 polls no more: dropped at its poll timeout (750 ms), its answer
  // with it; n2 leaves.
  v1::LeaveRequest leave;
  leave.set_node_id("n2");
  leave.set_round(0);
  leave.set_reason(v1::LeaveRequest::REASON_SHUTDOWN);
  Effects effects;
  job_->Leave(leave, now_, &effects);
  EXPECT_EQ(job_->answers_for_poll(), 1) << "n2 left";
  Advance(absl::Milliseconds(600));
  EXPECT_EQ(job_->answers_for_poll(), 0) << "n1 was dropped";
}

TEST_F(PollJoinTest, APollTakesAParkedSlotThatWasFreed) {
  Make(3, /*max_parked_joins=*/1);
  WaiterId n0 = Join("n0");
  EXPECT_FALSE(Answered(n0));
  ASSERT_TRUE(Waiting(Join("n1")));
  v1::LeaveRequest leave;
  leave.set_node_id("n0");
  leave.set_reason(v1::LeaveRequest::REASON_SHUTDOWN);
  Effects effects;
  job_->Leave(leave, now_, &effects);
  Absorb(std::move(effects));
  ASSERT_TRUE(Answered(n0));
  EXPECT_EQ(answers_.at(n0).status().code(), absl::StatusCode::kCancelled);
  Advance(absl::Milliseconds(250));
  WaiterId n1 = Join("n1");
  EXPECT_FALSE(Answered(n1)) << "a slot is free: this poll is parked";
  EXPECT_TRUE(Waiting(Join("n2"))) << "the slot is taken again";
  WaiterId n3 = Join("n3");  // the third node: the round closes
  ASSERT_TRUE(Answered(n1)) << "n1's parked poll is answered at the close";
  EXPECT_EQ(AssignmentOf(n1).num_nodes(), 3);
  EXPECT_EQ(AssignmentOf(n3).num_nodes(), 3);
  EXPECT_EQ(AssignmentOf(Join("n2")).num_nodes(), 3);
}

TEST_F(PollJoinTest, APollingNodeLearnsTheJobEnded) {
  v1::JobConfig config = ScaleConfig(2);
  config.set_max_restarts(0);
  Make(2, /*max_parked_joins=*/0, config);
  ASSERT_TRUE(Waiting(Join("n0")));
  ASSERT_EQ(AssignmentOf(Join("n1")).round(), 0);
  ASSERT_EQ(AssignmentOf(Join("n0")).round(), 0);
  // The round is full: a third node waits by polling.
  ASSERT_TRUE(Waiting(Join("n2")));
  v1::ReportFailureRequest report;
  report.set_node_id("n1");
  report.set_round(0);
  Effects effects;
  EXPECT_TRUE(job_->ReportFailure(report, now_, &effects).restarts_exhausted());
  Absorb(std::move(effects));
  Advance(absl::Milliseconds(250));
  WaiterId n2 = Join("n2");
  ASSERT_TRUE(Answered(n2));
  ASSERT_TRUE(answers_.at(n2).ok());
  ASSERT_TRUE(answers_.at(n2)->has_ended());
  EXPECT_EQ(answers_.at(n2)->ended().state(), v1::JOB_STATE_FAILED);
}

TEST_F(PollJoinTest, AWaitingNodePollsRightAfterTheLastCall) {
  v1::JobConfig config = ScaleConfig(2);
  config.set_max_nodes(10);  // rule (c): closes at the last call
  config.set_last_call_timeout_ms(3000);
  Make(2, /*max_parked_joins=*/0, config);
  WaiterId n0 = Join("n0");
  ASSERT_TRUE(Waiting(n0));
  EXPECT_EQ(answers_.at(n0)->waiting().poll_interval_ms(), 250)
      << "min_nodes not reached: no close is expected yet";
  now_ += absl::Milliseconds(100);
  WaiterId n1 = Join("n1");  // min_nodes: the last call ends at 3100 ms
  ASSERT_TRUE(Waiting(n1));
  const v1::JoinWaiting& w = answers_.at(n1)->waiting();
  EXPECT_GE(w.poll_interval_ms(), 3000) << "not before the close";
  EXPECT_LT(w.poll_interval_ms(), 3000 + 250) << "within one interval after";
  EXPECT_GT(w.poll_timeout_ms(), w.poll_interval_ms());
  // n0 polls at 250 ms as it was told: its next poll too waits for the
  // close.
  now_ += absl::Milliseconds(150);
  WaiterId n0_poll = Join("n0");
  ASSERT_TRUE(Waiting(n0_poll));
  EXPECT_GE(answers_.at(n0_poll)->waiting().poll_interval_ms(), 2850);
  // Both poll when told, without a tick in between: the first poll past
  // the last call closes the round, and each collects its assignment.
  now_ +=
      absl::Milliseconds(answers_.at(n0_poll)->waiting().poll_interval_ms());
  EXPECT_EQ(AssignmentOf(Join("n0")).num_nodes(), 2);
  now_ = absl::UnixEpoch() + absl::Milliseconds(100 + w.poll_interval_ms());
  EXPECT_EQ(AssignmentOf(Join("n1")).num_nodes(), 2);
}

TEST_F(PollJoinTest, WaitingNodesPollWhenTheRoundIsExpectedFull) {
  Make(100, /*max_parked_joins=*/0);
  // 20 nodes, one every 10 ms (100 nodes/s): the other 80 are expected in
  // 800 ms.
  WaiterId last = 0;
  for (int i = 0; i < 20; ++i) {
    if (i > 0) now_ += absl::Milliseconds(10);
    last = Join("n" + std::to_string(i));
    ASSERT_TRUE(Waiting(last));
  }
  const int64_t delay = answers_.at(last)->waiting().poll_interval_ms();
  EXPECT_GE(delay, 800) << "not before the round is expected full";
  EXPECT_LE(delay, 800 + 250) << "spread over one interval after it";
  // Waiting answers take successive places: 20 polling nodes spread their
  // collecting polls over the interval.
  std::set<int64_t> delays;
  for (int i = 0; i < 20; ++i) {
    delays.insert(answers_.at(Join("n" + std::to_string(i)))
                      ->waiting()
                      .poll_interval_ms());
  }
  EXPECT_GE(delays.size(), 10u) << "the polls are spread, not at one instant";
}

TEST_F(PollJoinTest, AFarCloseIsPolledForAtMostTheMaximumDelay) {
  Make(1000, /*max_parked_joins=*/0);
  options_.poll.max_delay = absl::Seconds(5);
  job_ = std::make_unique<Job>("job", ScaleConfig(1000), now_, options_);
  // 10 nodes in 1 s: the other 990 are expected in ~110 s.
  WaiterId last = 0;
  for (int i = 0; i < 10; ++i) {
    if (i > 0) now_ += absl::Milliseconds(111);
    last = Join("n" + std::to_string(i));
  }
  ASSERT_TRUE(Waiting(last));
  EXPECT_EQ(answers_.at(last)->waiting().poll_interval_ms(), 5000);
  EXPECT_GT(answers_.at(last)->waiting().poll_timeout_ms(), 5000);
  // The node polls after 5 s as told: it is still in the job (its
  // deadline followed the delay it was given).
  // (The first ones, told to poll sooner and silent since, are dropped.)
  Advance(absl::Seconds(5));
  bool n9_waits = false;
  const v1::JobStatus status = job_->Status(now_);
  for (const v1::NodeStatus& node : status.nodes()) {
    n9_waits |= node.node_id() == "n9";
  }
  EXPECT_TRUE(n9_waits);
  WaiterId again = Join("n9");
  ASSERT_TRUE(Waiting(again));
  EXPECT_EQ(answers_.at(again)->waiting().poll_interval_ms(), 5000)
      << "the close is still far";
}

}  // namespace
}  // namespace ddprun::rendezvous
