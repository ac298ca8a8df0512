// Rendezvous.Heartbeats on a real server: each beat on the stream is answered
// as a unary Heartbeat would be and counts as the node's sign of life; a node
// whose stream stops sending is lost though the stream stays open; the token
// is checked when the stream opens; a cancelled stream leaves nothing behind.
#include "rendezvous/service/heartbeat_stream.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_token.h"
#include "rendezvous/service/server.h"
#include "tests/testing/client_context.h"
#include "tests/testing/join_request.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

using ::ddprun::testing::BoundedContext;
using ::ddprun::testing::WaitFor;
using BeatStream =
    grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>;

constexpr char kSecret[] = "heartbeat-stream-secret";

v1::JoinRequest JoinRequest(const std::string& run_id, const std::string& node,
                            int nnodes) {
  return testing::NodeJoin(run_id, node, nnodes,
                           {.heartbeat_timeout_ms = 600, .max_restarts = 3});
}

v1::HeartbeatRequest Beat(const std::string& run_id, const std::string& node,
                          int64_t round) {
  v1::HeartbeatRequest request;
  request.set_run_id(run_id);
  request.set_node_id(node);
  request.set_round(round);
  return request;
}

class HeartbeatStreamTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& token, int64_t max_streams = 1024) {
    ServerOptions options;
    options.token = token;
    options.max_heartbeat_streams = max_streams;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Rendezvous::NewStub(grpc::CreateChannel(
        server_->endpoint(), grpc::InsecureChannelCredentials()));
  }

  // Joins `nodes` nodes of job `run_id` at once; returns the round.
  int64_t FormRound(const std::string& run_id, int nodes,
                    const std::string& token = "") {
    std::vector<std::thread> threads;
    std::vector<v1::JoinResponse> responses(nodes);
    std::vector<grpc::Status> statuses(nodes);
    for (int i = 0; i < nodes; ++i) {
      threads.emplace_back([&, i] {
        statuses[i] = stub_->Join(
            BoundedContext(token).get(),
            JoinRequest(run_id, "n" + std::to_string(i), nodes), &responses[i]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < nodes; ++i) {
      EXPECT_TRUE(statuses[i].ok()) << statuses[i].error_message();
      EXPECT_TRUE(responses[i].has_assignment());
    }
    return responses[0].assignment().round();
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

// A round that ends (a peer reports a failure) is pushed at once to the
// other node's stream, without waiting for its next beat: the answer that
// beat would get, marked pushed. It counts as no beat, and the next beat is
// answered as before.
TEST_F(HeartbeatStreamTest, ARoundThatEndsIsPushedToItsNodesAtOnce) {
  StartServer("");
  const int64_t round = FormRound("pushed", 2);
  auto context = BoundedContext();
  std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
  ASSERT_TRUE(stream->Write(Beat("pushed", "n0", round)));
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_FALSE(answer.pushed());
  EXPECT_FALSE(answer.rejoin());

  v1::ReportFailureRequest fail;
  fail.set_run_id("pushed");
  fail.set_node_id("n1");
  fail.set_round(round);
  v1::ReportFailureResponse failed;
  ASSERT_TRUE(stub_->ReportFailure(BoundedContext().get(), fail, &failed).ok());

  // No beat was sent: what arrives is the push.
  v1::HeartbeatResponse pushed;
  ASSERT_TRUE(stream->Read(&pushed));
  EXPECT_TRUE(pushed.pushed());
  EXPECT_TRUE(pushed.rejoin());
  EXPECT_GT(pushed.round(), round);
  EXPECT_EQ(server_->HeartbeatPushesForTest(), 1);
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 1);

  ASSERT_TRUE(stream->Write(Beat("pushed", "n0", round)));
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_FALSE(answer.pushed());
  EXPECT_TRUE(answer.rejoin());
  EXPECT_EQ(server_->HeartbeatPushesForTest(), 1);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(HeartbeatStreamTest, EachBeatIsAnsweredAsAUnaryHeartbeatWouldBe) {
  StartServer("");
  const int64_t round = FormRound("streamed", 2);
  auto context = BoundedContext();
  std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stream->Write(Beat("streamed", "n0", round)));
    v1::HeartbeatResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_EQ(answer.round(), round);
    EXPECT_EQ(answer.state(), v1::JOB_STATE_RUNNING);
    EXPECT_FALSE(answer.rejoin());
  }
  // The fast path ran: the server counted the beats on its stream.
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 3);
  EXPECT_EQ(server_->OpenHeartbeatStreamsForTest(), 1);
  // A beat of a round that is over is told to rejoin, as on the unary path.
  ASSERT_TRUE(stream->Write(Beat("streamed", "n0", round - 1)));
  v1::HeartbeatResponse stale;
  ASSERT_TRUE(stream->Read(&stale));
  EXPECT_TRUE(stale.rejoin());
  ASSERT_TRUE(stream->WritesDone());
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(
      WaitFor([&] { return server_->OpenHeartbeatStreamsForTest() == 0; },
              absl::Seconds(10)));
}

TEST_F(HeartbeatStreamTest, ANodeWhoseStreamStopsSendingIsLost) {
  StartServer("");
  const int64_t round = FormRound("silent", 2);
  // n0's stream stays open after one beat; n1 keeps beating on its own.
  auto silent_context = BoundedContext();
  std::unique_ptr<BeatStream> silent = stub_->Heartbeats(silent_context.get());
  ASSERT_TRUE(silent->Write(Beat("silent", "n0", round)));
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(silent->Read(&answer));
  EXPECT_FALSE(answer.rejoin());

  auto live_context = BoundedContext();
  std::unique_ptr<BeatStream> live = stub_->Heartbeats(live_context.get());
  bool told_rejoin = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!told_rejoin && absl::Now() < give_up) {
    ASSERT_TRUE(live->Write(Beat("silent", "n1", round)));
    ASSERT_TRUE(live->Read(&answer));
    told_rejoin = answer.rejoin();
    if (!told_rejoin) absl::SleepFor(absl::Milliseconds(50));  // pacing
  }
  EXPECT_TRUE(told_rejoin) << "n0 went silent on an open stream and was "
                              "never dropped";
  EXPECT_EQ(server_->OpenHeartbeatStreamsForTest(), 2);
  // n0's next beat on the same stream learns its round is over.
  ASSERT_TRUE(silent->Write(Beat("silent", "n0", round)));
  ASSERT_TRUE(silent->Read(&answer));
  EXPECT_TRUE(answer.rejoin());
  silent_context->TryCancel();
  live_context->TryCancel();
  EXPECT_TRUE(
      WaitFor([&] { return server_->OpenHeartbeatStreamsForTest() == 0; },
              absl::Seconds(10)));
}

TEST_F(HeartbeatStreamTest, AnUnknownJobEndsTheStreamNotFound) {
  StartServer("");
  auto context = BoundedContext();
  std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
  ASSERT_TRUE(stream->Write(Beat("no-such-job", "n0", 1)));
  v1::HeartbeatResponse answer;
  EXPECT_FALSE(stream->Read(&answer));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 0);
}

// The first message's run_id and the stream's token: refused before the
// job is looked at, with the unary call's words.
TEST_F(HeartbeatStreamTest, TheTokenIsCheckedWhenTheStreamOpens) {
  StartServer(kSecret);
  const std::string token_a = *JobToken(kSecret, "job-a");
  const std::string token_b = *JobToken(kSecret, "job-b");
  const int64_t round = FormRound("job-a", 1, token_a);
  struct Attempt {
    std::string token;
    grpc::StatusCode code;
  };
  for (const Attempt& attempt :
       {Attempt{"", grpc::StatusCode::UNAUTHENTICATED},
        Attempt{"not-a-token", grpc::StatusCode::UNAUTHENTICATED},
        Attempt{token_b, grpc::StatusCode::PERMISSION_DENIED}}) {
    auto context = BoundedContext(attempt.token);
    std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
    ASSERT_TRUE(stream->Write(Beat("job-a", "n0", round)));
    v1::HeartbeatResponse answer;
    EXPECT_FALSE(stream->Read(&answer))
        << "admitted with '" << attempt.token << "'";
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), attempt.code) << status.error_message();
  }
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 0);

  // Job A's token admits its job; a later message naming job B on the
  // same stream is checked again and refused.
  auto context = BoundedContext(token_a);
  std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
  ASSERT_TRUE(stream->Write(Beat("job-a", "n0", round)));
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_FALSE(answer.rejoin());
  ASSERT_TRUE(stream->Write(Beat("job-b", "n0", 1)));
  EXPECT_FALSE(stream->Read(&answer));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << status.error_message();
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 1);
  EXPECT_TRUE(
      WaitFor([&] { return server_->OpenHeartbeatStreamsForTest() == 0; },
              absl::Seconds(10)));
}

TEST_F(HeartbeatStreamTest, CancelledStreamsLeaveNothingBehind) {
  StartServer("");
  const int64_t round = FormRound("cancelled", 1);
  constexpr int kStreams = 20;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<BeatStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(BoundedContext());
    streams.push_back(stub_->Heartbeats(contexts.back().get()));
    ASSERT_TRUE(streams.back()->Write(Beat("cancelled", "n0", round)));
    v1::HeartbeatResponse answer;
    ASSERT_TRUE(streams.back()->Read(&answer));
  }
  EXPECT_EQ(server_->OpenHeartbeatStreamsForTest(), kStreams);
  // Half are cancelled with a beat in flight, half between beats.
  for (int i = 0; i < kStreams; ++i) {
    if (i % 2 == 0) streams[i]->Write(Beat("cancelled", "n0", round));
    contexts[i]->TryCancel();
  }
  for (auto& stream : streams) {
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(
      WaitFor([&] { return server_->OpenHeartbeatStreamsForTest() == 0; },
              absl::Seconds(10)))
      << server_->OpenHeartbeatStreamsForTest() << " streams still open";
}

// HeartbeatRequest.more: one message carries several nodes' beats (a
// relay's batch), each answered as its own heartbeat, on both paths.
TEST_F(HeartbeatStreamTest, ABatchOfNodesIsAnsweredNodeByNode) {
  StartServer("");
  const int64_t round = FormRound("batched", 2);
  v1::HeartbeatRequest batch = Beat("batched", "n0", round);
  v1::NodeBeat* member = batch.add_more();
  member->set_node_id("n1");
  member->set_round(round);
  member->set_steps(5);  // ahead of n0, for 2 s (as its agent dates it)
  member->set_steps_age_ms(2000);
  member->set_sync(3);  // and through the round's state sync, for 1 s
  member->set_sync_age_ms(1000);
  v1::NodeBeat* stranger = batch.add_more();
  stranger->set_node_id("not-a-member");
  stranger->set_round(round);

  v1::HeartbeatResponse unary;
  grpc::Status status = stub_->Heartbeat(BoundedContext().get(), batch, &unary);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(unary.rejoin());
  ASSERT_EQ(unary.more_size(), 2);
  EXPECT_FALSE(unary.more(0).rejoin());
  EXPECT_EQ(unary.more(0).round(), round);
  EXPECT_EQ(unary.more(0).round_steps(), 5);
  EXPECT_GE(unary.more(0).round_steps_age_ms(), 2000);
  EXPECT_EQ(unary.more(0).round_sync(), 3);
  EXPECT_GE(unary.more(0).round_sync_age_ms(), 1000);
  EXPECT_LT(unary.more(0).round_sync_age_ms(), 2000);
  EXPECT_TRUE(unary.more(1).rejoin());

  auto context = BoundedContext();
  std::unique_ptr<BeatStream> stream = stub_->Heartbeats(context.get());
  ASSERT_TRUE(stream->Write(batch));
  v1::HeartbeatResponse streamed;
  ASSERT_TRUE(stream->Read(&streamed));
  EXPECT_FALSE(streamed.rejoin());
  ASSERT_EQ(streamed.more_size(), 2);
  EXPECT_FALSE(streamed.more(0).rejoin());
  EXPECT_TRUE(streamed.more(1).rejoin());
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 3);

  // Past the most one message may carry: refused with the numbers.
  v1::HeartbeatRequest too_many = Beat("batched", "n0", round);
  for (int i = 0; i < kMaxBeatsPerMessage; ++i) {
    v1::NodeBeat* beat = too_many.add_more();
    beat->set_node_id("n1");
    beat->set_round(round);
  }
  status = stub_->Heartbeat(BoundedContext().get(), too_many, &unary);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("1025"), std::string::npos)
      << status.error_message();
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(HeartbeatStreamTest, StreamsPastTheCapAreRefusedResourceExhausted) {
  StartServer("", /*max_streams=*/2);
  const int64_t round = FormRound("capped", 1);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<BeatStream>> streams;
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(BoundedContext());
    streams.push_back(stub_->Heartbeats(contexts.back().get()));
    ASSERT_TRUE(streams.back()->Write(Beat("capped", "n0", round)));
    v1::HeartbeatResponse answer;
    ASSERT_TRUE(streams.back()->Read(&answer));
  }
  auto context = BoundedContext();
  std::unique_ptr<BeatStream> third = stub_->Heartbeats(context.get());
  third->Write(Beat("capped", "n0", round));  // may fail: refused already
  v1::HeartbeatResponse answer;
  EXPECT_FALSE(third->Read(&answer));
  grpc::Status status = third->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("--max-heartbeat-streams"),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(server_->RefusedHeartbeatStreamsForTest(), 1);
  // A stream that closes makes room for another.
  contexts[0]->TryCancel();
  streams[0]->Finish();
  ASSERT_TRUE(
      WaitFor([&] { return server_->OpenHeartbeatStreamsForTest() == 1; },
              absl::Seconds(10)));
  auto fourth_context = BoundedContext();
  std::unique_ptr<BeatStream> fourth = stub_->Heartbeats(fourth_context.get());
  ASSERT_TRUE(fourth->Write(Beat("capped", "n0", round)));
  EXPECT_TRUE(fourth->Read(&answer));
  EXPECT_EQ(server_->StreamedHeartbeatsForTest(), 3);
}

}  // namespace
}  // namespace ddprun::rendezvous
