// Batched Join (JoinRequest.more) on a real server: the nodes of one message
// join as their own Joins would (same ranks, one round with single Joins),
// the call is answered once every node of it has its outcome, a per-node
// error sits in its slot, a cancelled batch drops its nodes, a malformed
// batch (another job's node, too many nodes, a node twice) is refused whole,
// batched nodes do not count against --max-parked-joins, and a round's
// heartbeat clock starts only when the answer holding the node was sent.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/credentials.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/core/job_token.h"
#include "rendezvous/service/server.h"
#include "tests/testing/client_context.h"
#include "tests/testing/join_request.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

using ::ddprun::testing::BoundedContext;
using ::ddprun::testing::WaitFor;
using ::google::protobuf::util::MessageDifferencer;

constexpr char kSecret[] = "join-batch-secret";

v1::JoinRequest NodeJoin(const std::string& run_id, const std::string& node,
                         int nnodes, int local_world_size = 1) {
  return testing::NodeJoin(run_id, node, nnodes,
                           {.local_world_size = local_world_size});
}

// One message for `nodes` (the first is the request's own node).
v1::JoinRequest Batch(const std::vector<v1::JoinRequest>& nodes) {
  v1::JoinRequest batch = nodes.at(0);
  for (size_t i = 1; i < nodes.size(); ++i) *batch.add_more() = nodes[i];
  return batch;
}

// The answers of a batch in node order.
std::vector<v1::JoinResponse> Slots(const v1::JoinResponse& response) {
  v1::JoinResponse first = response;
  first.clear_more();
  std::vector<v1::JoinResponse> slots = {first};
  for (const v1::JoinResponse& more : response.more()) slots.push_back(more);
  return slots;
}

// A Join running on its own thread; done() once answered.
class PendingJoin {
 public:
  PendingJoin(v1::Rendezvous::Stub* stub, v1::JoinRequest request,
              const std::string& token = "") {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    if (!token.empty()) {
      context_.AddMetadata("authorization", "Bearer " + token);
    }
    thread_ = std::thread([this, stub, request = std::move(request)] {
      status_ = stub->Join(&context_, request, &response_);
      done_.store(true);
    });
  }
  ~PendingJoin() { Wait(); }
  bool done() const { return done_.load(); }
  void Cancel() { context_.TryCancel(); }
  void Wait() {
    if (thread_.joinable()) thread_.join();
  }
  const grpc::Status& status() {
    Wait();
    return status_;
  }
  const v1::JoinResponse& response() {
    Wait();
    return response_;
  }

 private:
  grpc::ClientContext context_;
  grpc::Status status_;
  v1::JoinResponse response_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

class JoinBatchTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = {}) {
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Rendezvous::NewStub(grpc::CreateChannel(
        server_->endpoint(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Join(const v1::JoinRequest& request, v1::JoinResponse* response,
                    const std::string& token = "") {
    return stub_->Join(BoundedContext(token).get(), request, response);
  }

  // The job's nodes as Status lists them (empty when there is no job).
  std::vector<v1::NodeStatus> Nodes(const std::string& run_id,
                                    const std::string& token = "") {
    v1::StatusRequest request;
    request.set_run_id(run_id);
    v1::StatusResponse response;
    grpc::Status status =
        stub_->Status(BoundedContext(token).get(), request, &response);
    if (!status.ok() || response.jobs_size() == 0) return {};
    return {response.jobs(0).nodes().begin(), response.jobs(0).nodes().end()};
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

TEST_F(JoinBatchTest, ABatchGetsTheAssignmentsSingleJoinsGet) {
  StartServer();
  const std::vector<int> local_world_sizes = {1, 2, 3};
  const int n = static_cast<int>(local_world_sizes.size());
  auto nodes_of = [&](const std::string& run_id) {
    std::vector<v1::JoinRequest> nodes;
    for (int i = 0; i < n; ++i) {
      nodes.push_back(
          NodeJoin(run_id, "n" + std::to_string(i), n, local_world_sizes[i]));
    }
    return nodes;
  };
  // Single Joins, one at a time in node order (ranks follow arrival).
  std::vector<v1::JoinRequest> singles = nodes_of("singles");
  std::vector<std::unique_ptr<PendingJoin>> pending;
  for (int i = 0; i < n; ++i) {
    pending.push_back(std::make_unique<PendingJoin>(stub_.get(), singles[i]));
    if (i + 1 < n) {
      ASSERT_TRUE(WaitFor([&] { return Nodes("singles").size() == i + 1u; },
                          absl::Seconds(10)));
    }
  }
  // The same nodes in one message.
  v1::JoinResponse batched;
  grpc::Status status = Join(Batch(nodes_of("batched")), &batched);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<v1::JoinResponse> slots = Slots(batched);
  ASSERT_EQ(slots.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(pending[i]->status().ok())
        << pending[i]->status().error_message();
    ASSERT_TRUE(slots[i].has_assignment()) << slots[i].DebugString();
    const v1::Assignment& single = pending[i]->response().assignment();
    EXPECT_TRUE(MessageDifferencer::Equals(slots[i].assignment(), single))
        << "node " << i << ": batched " << slots[i].assignment().DebugString()
        << " single " << single.DebugString();
    EXPECT_EQ(slots[i].assignment().node_rank(), i);
  }
  EXPECT_EQ(slots[2].assignment().rank_offset(), 3);
  EXPECT_EQ(slots[0].assignment().world_size(), 6);
}

TEST_F(JoinBatchTest,
       ABatchIsAnsweredWhenTheRoundItFormsWithSingleJoinsCloses) {
  StartServer();
  PendingJoin batch(stub_.get(), Batch({NodeJoin("mixed", "b0", 3),
                                        NodeJoin("mixed", "b1", 3)}));
  ASSERT_TRUE(
      WaitFor([&] { return Nodes("mixed").size() == 2; }, absl::Seconds(10)));
  // One call holds both nodes.
  EXPECT_EQ(server_->NumParkedCallsForTest(), 1u);
  // The round lacks a node: the batch is not answered.
  EXPECT_FALSE(batch.done());
  v1::JoinResponse single;
  grpc::Status status = Join(NodeJoin("mixed", "s0", 3), &single);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(single.has_assignment());
  ASSERT_TRUE(batch.status().ok()) << batch.status().error_message();
  std::vector<v1::JoinResponse> slots = Slots(batch.response());
  ASSERT_EQ(slots.size(), 2u);
  std::vector<bool> ranks(3, false);
  ranks[single.assignment().node_rank()] = true;
  for (const v1::JoinResponse& slot : slots) {
    ASSERT_TRUE(slot.has_assignment()) << slot.DebugString();
    EXPECT_EQ(slot.assignment().round(), single.assignment().round());
    EXPECT_EQ(slot.assignment().num_nodes(), 3);
    ranks[slot.assignment().node_rank()] = true;
  }
  EXPECT_EQ(ranks, std::vector<bool>(3, true));
}

TEST_F(JoinBatchTest, ANodeRefusedIsAnsweredInItsSlotAndTheOthersJoin) {
  StartServer();
  v1::JoinRequest bad = NodeJoin("slots", "e1", 2);
  bad.set_local_world_size(0);
  v1::JoinResponse response;
  grpc::Status status =
      Join(Batch({NodeJoin("slots", "e0", 2), bad, NodeJoin("slots", "e2", 2)}),
           &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<v1::JoinResponse> slots = Slots(response);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_TRUE(slots[0].has_assignment());
  ASSERT_TRUE(slots[1].has_error()) << slots[1].DebugString();
  EXPECT_EQ(slots[1].error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(slots[1].error().message().find("local_world_size"),
            std::string::npos)
      << slots[1].error().message();
  EXPECT_TRUE(slots[2].has_assignment());
  EXPECT_EQ(slots[2].assignment().num_nodes(), 2);
}

TEST_F(JoinBatchTest, ACancelledBatchDropsAllItsNodes) {
  StartServer();
  PendingJoin batch(stub_.get(), Batch({NodeJoin("gone", "c0", 3),
                                        NodeJoin("gone", "c1", 3)}));
  ASSERT_TRUE(
      WaitFor([&] { return Nodes("gone").size() == 2; }, absl::Seconds(10)));
  batch.Cancel();
  EXPECT_EQ(batch.status().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(
      WaitFor([&] { return Nodes("gone").empty(); }, absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return server_->NumParkedCallsForTest() == 0; },
                      absl::Seconds(10)));
  // The job goes on without them: a round of new nodes forms.
  PendingJoin other(stub_.get(), NodeJoin("gone", "c2", 3));
  v1::JoinResponse response;
  grpc::Status status = Join(
      Batch({NodeJoin("gone", "c3", 3), NodeJoin("gone", "c4", 3)}), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.has_assignment());
  ASSERT_TRUE(other.status().ok()) << other.status().error_message();
  EXPECT_TRUE(other.response().has_assignment());
}

TEST_F(JoinBatchTest, ANodeOfAnotherJobRefusesTheWholeBatch) {
  ServerOptions options;
  options.token = kSecret;
  StartServer(options);
  const std::string token_a = *JobToken(kSecret, "job-a");
  v1::JoinResponse response;
  // Job A's token, one node of job B in `more`: a bypass of B's token.
  grpc::Status status =
      Join(Batch({NodeJoin("job-a", "a0", 2), NodeJoin("job-b", "b0", 2)}),
           &response, token_a);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("job 'job-b'"), std::string::npos)
      << status.error_message();
  // Nothing of it joined: neither job exists.
  v1::StatusResponse all;
  status =
      stub_->Status(BoundedContext(kSecret).get(), v1::StatusRequest(), &all);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(all.jobs_size(), 0) << all.DebugString();
  // The same batch with job A's nodes only is admitted.
  status = Join(Batch({NodeJoin("job-a", "a0", 2), NodeJoin("job-a", "a1", 2)}),
                &response, token_a);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.has_assignment());
  ASSERT_EQ(response.more_size(), 1);
  EXPECT_TRUE(response.more(0).has_assignment());
}

TEST_F(JoinBatchTest, MalformedBatchesAreRefusedWholeAndNothingJoins) {
  StartServer();
  v1::JoinResponse response;
  // A node twice.
  grpc::Status status =
      Join(Batch({NodeJoin("bad", "d0", 3), NodeJoin("bad", "d1", 3),
                  NodeJoin("bad", "d0", 3)}),
           &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("'d0' twice"), std::string::npos)
      << status.error_message();
  // A `more` nested in `more`.
  v1::JoinRequest nested = NodeJoin("bad", "d1", 3);
  *nested.add_more() = NodeJoin("bad", "d2", 3);
  status = Join(Batch({NodeJoin("bad", "d0", 3), nested}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("of its own"), std::string::npos)
      << status.error_message();
  // Past the cap: refused with the numbers and the fix.
  std::vector<v1::JoinRequest> too_many;
  for (int i = 0; i <= kMaxJoinsPerMessage; ++i) {
    too_many.push_back(NodeJoin("bad", "t" + std::to_string(i), 3));
  }
  status = Join(Batch(too_many), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("1025"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("split"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(Nodes("bad").empty());
  EXPECT_EQ(server_->NumParkedCallsForTest(), 0u);
  // Resume takes one node per call.
  v1::JoinRequest resume =
      Batch({NodeJoin("bad", "r0", 2), NodeJoin("bad", "r1", 2)});
  resume.mutable_record()->mutable_assignment()->set_round(0);
  v1::ResumeResponse resumed;
  status = stub_->Resume(BoundedContext().get(), resume, &resumed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Nodes("bad").empty());
}

TEST_F(JoinBatchTest, AsManyNodesAsTheCapJoinInOneMessage) {
  StartServer();
  std::vector<v1::JoinRequest> nodes;
  for (int i = 0; i < kMaxJoinsPerMessage; ++i) {
    nodes.push_back(
        NodeJoin("full", "f" + std::to_string(i), kMaxJoinsPerMessage));
  }
  v1::JoinResponse response;
  grpc::Status status = Join(Batch(nodes), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<v1::JoinResponse> slots = Slots(response);
  ASSERT_EQ(slots.size(), static_cast<size_t>(kMaxJoinsPerMessage));
  for (int i = 0; i < kMaxJoinsPerMessage; ++i) {
    ASSERT_TRUE(slots[i].has_assignment()) << i;
    EXPECT_EQ(slots[i].assignment().node_rank(), i);
  }
}

TEST_F(JoinBatchTest, BatchedNodesDoNotCountAgainstMaxParkedJoins) {
  ServerOptions options;
  options.max_parked_joins = 1;
  StartServer(options);
  std::vector<v1::JoinRequest> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(NodeJoin("capped", "p" + std::to_string(i), 4));
    nodes.back().set_poll(true);
  }
  PendingJoin batch(stub_.get(), Batch(nodes));
  ASSERT_TRUE(
      WaitFor([&] { return Nodes("capped").size() == 3; }, absl::Seconds(10)));
  EXPECT_FALSE(batch.done());
  // The parked slot is still free for a single polling Join: parked, and
  // the round of four closes (had the batch's nodes counted, two of them
  // and this one would be answered `waiting`).
  v1::JoinRequest single = NodeJoin("capped", "p3", 4);
  single.set_poll(true);
  v1::JoinResponse response;
  grpc::Status status = Join(single, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.has_assignment()) << response.DebugString();
  ASSERT_TRUE(batch.status().ok()) << batch.status().error_message();
  for (const v1::JoinResponse& slot : Slots(batch.response())) {
    EXPECT_TRUE(slot.has_assignment()) << slot.DebugString();
  }
}

TEST_F(JoinBatchTest, TheHeartbeatClockStartsWhenTheBatchAnswerWasSent) {
  StartServer();
  // One node per round: a0 closes round 0 at once; a1 waits for a round
  // (the running one is full) until its join timeout, long after a0's
  // heartbeat timeout. The batch is answered only then: a0's clock must
  // not have run meanwhile.
  v1::JoinRequest a0 = NodeJoin("clock", "a0", 1);
  v1::JoinRequest a1 = NodeJoin("clock", "a1", 1);
  for (v1::JoinRequest* r : {&a0, &a1}) {
    r->mutable_config()->set_heartbeat_timeout_ms(300);
    r->mutable_config()->set_join_timeout_ms(1500);
  }
  v1::JoinResponse response;
  grpc::Status status = Join(Batch({a0, a1}), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(response.has_assignment()) << response.DebugString();
  ASSERT_EQ(response.more_size(), 1);
  ASSERT_TRUE(response.more(0).has_error()) << response.DebugString();
  EXPECT_EQ(response.more(0).error().code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // a0 beats right after its answer: it is a member, not lost.
  v1::HeartbeatRequest beat;
  beat.set_run_id("clock");
  beat.set_node_id("a0");
  beat.set_round(response.assignment().round());
  v1::HeartbeatResponse answer;
  status = stub_->Heartbeat(BoundedContext().get(), beat, &answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(answer.rejoin()) << answer.DebugString();
  EXPECT_EQ(answer.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(answer.round(), response.assignment().round());
}

}  // namespace
}  // namespace ddprun::rendezvous
