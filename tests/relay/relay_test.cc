// ddprun-relay in process, in front of a real rendezvous server, both on
// kernel-chosen ports: batched Joins rank as direct Joins do, heartbeats
// through the relay keep nodes alive (and a silent one is lost), store calls
// and their token checks pass through, cancellation before and after a
// batch is sent, and an upstream that is not listening.
#include "relay/relay.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "relay/join_fanout.h"
#include "rendezvous/core/job_token.h"
#include "rendezvous/service/server.h"
#include "tests/testing/client_context.h"
#include "tests/testing/join_request.h"
#include "tests/testing/old_servers.h"
#include "tests/testing/wait_for.h"

namespace ddprun::relay {
namespace {

using ::ddprun::testing::BoundedContext;
using ::ddprun::testing::NoStreamServer;
using ::ddprun::testing::StartFakeServer;
using ::ddprun::testing::WaitFor;

constexpr char kSecret[] = "relay-test-secret";

v1::JoinRequest NodeJoin(const std::string& run_id, const std::string& node,
                         int nnodes, int64_t heartbeat_timeout_ms = 30000) {
  return testing::NodeJoin(run_id, node, nnodes,
                           {.local_world_size = 2,
                            .heartbeat_timeout_ms = heartbeat_timeout_ms,
                            .last_call_timeout_ms = 100});
}

// A server, and a relay in front of it.
class RelayTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& token = "") {
    rendezvous::ServerOptions options;
    options.token = token;
    auto server = rendezvous::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    direct_ = v1::Rendezvous::NewStub(grpc::CreateChannel(
        server_->endpoint(), grpc::InsecureChannelCredentials()));
  }
  void StartRelay(int max_batch, absl::Duration window,
                  std::string upstream = "") {
    RelayOptions options;
    options.upstream = upstream.empty() ? server_->endpoint() : upstream;
    options.max_batch = max_batch;
    options.batch_window = window;
    auto relay = Relay::Start(options);
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = *std::move(relay);
    channel_ = grpc::CreateChannel(relay_->endpoint(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Rendezvous::NewStub(channel_);
    store_ = v1::Store::NewStub(channel_);
  }
  void TearDown() override {
    if (relay_ != nullptr) relay_->Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  // Joins every node at once (one thread each); the answers in node order.
  std::vector<v1::JoinResponse> JoinAll(
      v1::Rendezvous::Stub* stub, const std::vector<v1::JoinRequest>& nodes) {
    std::vector<v1::JoinResponse> responses(nodes.size());
    std::vector<grpc::Status> statuses(nodes.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] {
        auto context = BoundedContext();
        statuses[i] = stub->Join(context.get(), nodes[i], &responses[i]);
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < nodes.size(); ++i) {
      EXPECT_TRUE(statuses[i].ok())
          << nodes[i].node_id() << ": " << statuses[i].error_message();
    }
    return responses;
  }

  std::optional<v1::JobStatus> Job(const std::string& run_id) {
    v1::StatusRequest request;
    request.set_run_id(run_id);
    v1::StatusResponse response;
    auto context = BoundedContext();
    if (!direct_->Status(context.get(), request, &response).ok() ||
        response.jobs_size() == 0) {
      return std::nullopt;
    }
    return response.jobs(0);
  }

  double Counter(const common::Counter& counter) { return counter.value(); }

  std::unique_ptr<rendezvous::Server> server_;
  std::unique_ptr<v1::Rendezvous::Stub> direct_;
  std::unique_ptr<Relay> relay_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::unique_ptr<v1::Store::Stub> store_;
};

// The sorted (rank_offset, world) of a round's answers, and their checks.
std::set<int> CheckRound(const std::vector<v1::JoinResponse>& responses,
                         int nnodes) {
  std::set<int> ranks;
  for (const v1::JoinResponse& response : responses) {
    EXPECT_TRUE(response.has_assignment()) << response.DebugString();
    const v1::Assignment& a = response.assignment();
    EXPECT_EQ(a.num_nodes(), nnodes);
    EXPECT_EQ(a.world_size(), 2 * nnodes);
    EXPECT_EQ(a.rank_offset(), 2 * a.node_rank());
    EXPECT_EQ(a.master_addr(), responses[0].assignment().master_addr());
    EXPECT_EQ(a.round(), responses[0].assignment().round());
    ranks.insert(a.node_rank());
  }
  return ranks;
}

TEST_F(RelayTest, JoinsThroughTheRelayRankAsDirectJoinsInFewerCalls) {
  StartServer();
  // A window far longer than the test: only full batches are sent, so the
  // count is exact.
  StartRelay(/*max_batch=*/16, absl::Minutes(5));
  constexpr int kNodes = 64;
  std::vector<v1::JoinRequest> relayed, direct;
  for (int i = 0; i < kNodes; ++i) {
    relayed.push_back(NodeJoin("relayed", absl::StrCat("n", i), kNodes));
    direct.push_back(NodeJoin("direct", absl::StrCat("n", i), kNodes));
  }
  std::set<int> via_relay = CheckRound(JoinAll(stub_.get(), relayed), kNodes);
  std::set<int> via_server = CheckRound(JoinAll(direct_.get(), direct), kNodes);
  EXPECT_EQ(via_relay.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(via_relay, via_server);
  EXPECT_EQ(Counter(relay_->counters().joins), kNodes);
  EXPECT_EQ(Counter(relay_->counters().upstream_join_calls), kNodes / 16);
  // The server saw the same job either way.
  auto a = Job("relayed");
  auto b = Job("direct");
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->world_size(), b->world_size());
  EXPECT_EQ(a->nodes_size(), b->nodes_size());
}

TEST_F(RelayTest, AShortWindowStillBatches) {
  StartServer();
  StartRelay(/*max_batch=*/64, absl::Milliseconds(20));
  constexpr int kNodes = 64;
  std::vector<v1::JoinRequest> nodes;
  for (int i = 0; i < kNodes; ++i) {
    nodes.push_back(NodeJoin("short", absl::StrCat("n", i), kNodes));
  }
  CheckRound(JoinAll(stub_.get(), nodes), kNodes);
  EXPECT_LT(Counter(relay_->counters().upstream_join_calls), kNodes);
  EXPECT_GE(Counter(relay_->counters().upstream_join_calls), 1);
}

TEST_F(RelayTest, PerNodeErrorEndsOnlyThatCaller) {
  StartServer();
  StartRelay(/*max_batch=*/2, absl::Minutes(5));
  v1::JoinRequest good = NodeJoin("errs", "good", 1);
  v1::JoinRequest bad = NodeJoin("errs", "bad", 1);
  bad.mutable_config()->set_max_nodes(3);  // differs from the job's
  bad.mutable_config()->set_min_nodes(3);
  v1::JoinResponse good_answer, bad_answer;
  grpc::Status good_status, bad_status;
  std::thread first([&] {
    auto context = BoundedContext();
    good_status = stub_->Join(context.get(), good, &good_answer);
  });
  // The good node first, so that its config makes the job.
  ASSERT_TRUE(WaitFor([&] { return Counter(relay_->counters().joins) == 1; },
                      absl::Seconds(10)));
  auto context = BoundedContext();
  bad_status = stub_->Join(context.get(), bad, &bad_answer);
  first.join();
  EXPECT_TRUE(good_status.ok()) << good_status.error_message();
  EXPECT_TRUE(good_answer.has_assignment());
  EXPECT_EQ(bad_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << bad_status.error_message();
  EXPECT_EQ(Counter(relay_->counters().upstream_join_calls), 1);
}

TEST_F(RelayTest, ABatchedJoinPassesThroughUnchanged) {
  StartServer();
  StartRelay(/*max_batch=*/64, absl::Minutes(5));
  v1::JoinRequest batch = NodeJoin("sent-batched", "a", 2);
  *batch.add_more() = NodeJoin("sent-batched", "b", 2);
  v1::JoinResponse response;
  auto context = BoundedContext();
  grpc::Status status = stub_->Join(context.get(), batch, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.has_assignment());
  ASSERT_EQ(response.more_size(), 1);
  EXPECT_TRUE(response.more(0).has_assignment());
  EXPECT_EQ(Counter(relay_->counters().joins), 0);
  EXPECT_EQ(Counter(relay_->counters().passthrough_calls), 1);
}

// One thread beats for every node on its own stream each tick, as agents
// on one rack would; answers are read back in order.
class Beaters {
 public:
  Beaters(v1::Rendezvous::Stub* stub, const std::string& run_id,
          const std::vector<v1::JoinResponse>& answers,
          const std::vector<std::string>& nodes)
      : run_id_(run_id) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto stream = std::make_unique<Stream>();
      stream->node = nodes[i];
      stream->round = answers[i].assignment().round();
      stream->rw = stub->Heartbeats(&stream->context);
      streams_.push_back(std::move(stream));
    }
  }
  // Beats every live node once; returns false if a stream broke.
  bool Tick() {
    for (auto& s : streams_) {
      if (s->stopped) continue;
      v1::HeartbeatRequest request;
      request.set_run_id(run_id_);
      request.set_node_id(s->node);
      request.set_round(s->round);
      if (!s->rw->Write(request)) return false;
    }
    for (auto& s : streams_) {
      if (s->stopped) continue;
      v1::HeartbeatResponse response;
      if (!s->rw->Read(&response)) return false;
      if (response.rejoin()) s->rejoin = true;
    }
    return true;
  }
  void Stop(size_t i) {
    streams_[i]->stopped = true;
    streams_[i]->rw->WritesDone();
  }
  bool rejoin(size_t i) const { return streams_[i]->rejoin; }
  ~Beaters() {
    for (auto& s : streams_) {
      s->context.TryCancel();
      s->rw->Finish();
    }
  }

 private:
  struct Stream {
    std::string node;
    int64_t round = 0;
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>>
        rw;
    bool stopped = false;
    bool rejoin = false;
  };
  const std::string run_id_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

TEST_F(RelayTest, HeartbeatsThroughTheRelayKeepNodesAliveAndLoseASilentOne) {
  StartServer();
  // 50 ms: a tick's beats (one per node, microseconds apart) share one
  // upstream message.
  StartRelay(/*max_batch=*/64, absl::Milliseconds(50));
  constexpr int kNodes = 3;
  constexpr int64_t kTimeoutMs = 400;
  std::vector<v1::JoinRequest> nodes;
  std::vector<std::string> ids;
  for (int i = 0; i < kNodes; ++i) {
    ids.push_back(absl::StrCat("n", i));
    nodes.push_back(NodeJoin("beats", ids.back(), kNodes, kTimeoutMs));
  }
  std::vector<v1::JoinResponse> answers = JoinAll(stub_.get(), nodes);
  CheckRound(answers, kNodes);
  Beaters beaters(stub_.get(), "beats", answers, ids);
  // Several heartbeat timeouts' worth of ticks, counted by the server's
  // clock through the answers: every node stays a member.
  absl::Time until = absl::Now() + absl::Milliseconds(5 * kTimeoutMs);
  while (absl::Now() < until) {
    ASSERT_TRUE(beaters.Tick());
    absl::SleepFor(absl::Milliseconds(50));  // the agents' interval
  }
  for (int i = 0; i < kNodes; ++i) EXPECT_FALSE(beaters.rejoin(i)) << i;
  auto job = Job("beats");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->round(), answers[0].assignment().round());
  double beats = Counter(relay_->counters().beats);
  double messages = Counter(relay_->counters().upstream_beat_messages);
  EXPECT_GT(beats, kNodes * 5);
  EXPECT_LT(messages, beats) << "no heartbeat batch was sent";

  // Node 2 goes silent: its peers are told to rejoin.
  beaters.Stop(2);
  EXPECT_TRUE(WaitFor(
      [&] {
        if (!beaters.Tick()) return false;
        absl::SleepFor(absl::Milliseconds(50));
        return beaters.rejoin(0) && beaters.rejoin(1);
      },
      absl::Seconds(20)));
}

TEST_F(RelayTest, UnaryHeartbeatGoesThroughTheMux) {
  StartServer();
  StartRelay(/*max_batch=*/64, absl::Milliseconds(2));
  std::vector<v1::JoinResponse> answers =
      JoinAll(stub_.get(), {NodeJoin("unary", "n0", 1)});
  v1::HeartbeatRequest request;
  request.set_run_id("unary");
  request.set_node_id("n0");
  request.set_round(answers[0].assignment().round());
  v1::RankFigures* figures = request.add_ranks();
  figures->set_phase("step");
  figures->set_steps(7);
  request.set_steps(7);
  request.set_steps_age_ms(300);
  request.set_sync(4);
  request.set_sync_age_ms(200);
  v1::HeartbeatResponse response;
  auto context = BoundedContext();
  grpc::Status status = stub_->Heartbeat(context.get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(response.rejoin());
  EXPECT_EQ(response.state(), v1::JOB_STATE_RUNNING);
  // Its steps, its sync and their ages went through, and came back as the
  // round's.
  EXPECT_EQ(response.round_steps(), 7);
  EXPECT_GE(response.round_steps_age_ms(), 300);
  EXPECT_LT(response.round_steps_age_ms(), 300 + 60'000);
  EXPECT_EQ(response.round_sync(), 4);
  EXPECT_GE(response.round_sync_age_ms(), 200);
  EXPECT_LT(response.round_sync_age_ms(), 200 + 60'000);
  // The node's rank figures went through with its beat.
  auto job = Job("unary");
  ASSERT_TRUE(job.has_value());
  ASSERT_EQ(job->nodes_size(), 1);
  ASSERT_EQ(job->nodes(0).ranks_size(), 1);
  EXPECT_EQ(job->nodes(0).ranks(0).steps(), 7);
  EXPECT_EQ(Counter(relay_->counters().beats), 1);
  EXPECT_EQ(Counter(relay_->counters().upstream_beat_messages), 1);
  // A job the server does not know: the server's NOT_FOUND, as is.
  request.set_run_id("nobody");
  auto again = BoundedContext();
  status = stub_->Heartbeat(again.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();
}

TEST_F(RelayTest, StoreCallsAndTheirTokenChecksPassThrough) {
  StartServer(kSecret);
  StartRelay(/*max_batch=*/64, absl::Milliseconds(2));
  auto token = rendezvous::JobToken(kSecret, "job-a");
  ASSERT_TRUE(token.ok());
  v1::StoreScope scope;
  scope.set_run_id("job-a");
  scope.set_round(1);

  // A Wait parked on the server through the relay, released by a Set.
  grpc::Status wait_status;
  std::thread waiter([&] {
    v1::WaitRequest request;
    *request.mutable_scope() = scope;
    request.add_keys("ready");
    v1::WaitResponse response;
    auto context = BoundedContext(*token);
    wait_status = store_->Wait(context.get(), request, &response);
  });
  ASSERT_TRUE(WaitFor([&] { return server_->NumStoreWaitersForTest() == 1; },
                      absl::Seconds(10)));
  {
    v1::SetRequest request;
    *request.mutable_scope() = scope;
    request.set_key("ready");
    request.set_value("yes");
    v1::SetResponse response;
    auto context = BoundedContext(*token);
    grpc::Status status = store_->Set(context.get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  waiter.join();
  EXPECT_TRUE(wait_status.ok()) << wait_status.error_message();
  {
    v1::GetRequest request;
    *request.mutable_scope() = scope;
    request.set_key("ready");
    v1::GetResponse response;
    auto context = BoundedContext(*token);
    grpc::Status status = store_->Get(context.get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.value(), "yes");
  }
  {
    v1::AddRequest request;
    *request.mutable_scope() = scope;
    request.set_key("count");
    request.set_delta(5);
    v1::AddResponse response;
    auto context = BoundedContext(*token);
    grpc::Status status = store_->Add(context.get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.value(), 5);
  }
  // Another job's key with job-a's token.
  {
    v1::GetRequest request;
    request.mutable_scope()->set_run_id("job-b");
    request.mutable_scope()->set_round(1);
    request.set_key("ready");
    request.set_timeout_ms(100);
    v1::GetResponse response;
    auto context = BoundedContext(*token);
    grpc::Status status = store_->Get(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << status.error_message();
  }
  // A wrong token.
  {
    v1::SetRequest request;
    *request.mutable_scope() = scope;
    request.set_key("x");
    v1::SetResponse response;
    auto context = BoundedContext("not-the-token");
    grpc::Status status = store_->Set(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << status.error_message();
  }
  // A Join with a wrong token is refused too (its batch, whole).
  {
    v1::JoinResponse response;
    auto context = BoundedContext("not-the-token");
    grpc::Status status =
        stub_->Join(context.get(), NodeJoin("job-a", "n0", 1), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << status.error_message();
  }
  EXPECT_GE(Counter(relay_->counters().passthrough_calls), 6);
}

TEST_F(RelayTest, ACallerCancelledBeforeTheFlushNeverJoins) {
  StartServer();
  StartRelay(/*max_batch=*/2, absl::Minutes(5));
  {
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
    v1::JoinResponse response;
    grpc::Status status =
        stub_->Join(&context, NodeJoin("cancel", "gone", 2), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The relay learns of the deadline on its own timer.
  ASSERT_TRUE(WaitFor([&] { return relay_->NumPendingJoinsForTest() == 0; },
                      absl::Seconds(10)));
  EXPECT_EQ(Counter(relay_->counters().joins), 1);  // it reached the relay
  // Had "gone" stayed in the group, it would have been sent with "a".
  std::vector<v1::JoinResponse> answers = JoinAll(
      stub_.get(), {NodeJoin("cancel", "a", 2), NodeJoin("cancel", "b", 2)});
  CheckRound(answers, 2);
  auto job = Job("cancel");
  ASSERT_TRUE(job.has_value());
  for (const v1::NodeStatus& node : job->nodes()) {
    EXPECT_NE(node.node_id(), "gone");
  }
  EXPECT_EQ(Counter(relay_->counters().upstream_join_calls), 1);
}

TEST_F(RelayTest, ACallerCancelledAfterTheFlushIsDroppedPromptly) {
  StartServer();
  StartRelay(/*max_batch=*/1, absl::Milliseconds(2));
  // A heartbeat timeout far beyond the bound below, and an interval that
  // makes the grace for a member's first heartbeat as long (4 intervals):
  // only the relay's Leave can drop the node in time. (With 100 ms, the
  // grace's 2 s floor dropped it first on a loaded CI machine.)
  auto slow_beats = [](v1::JoinRequest request) {
    request.mutable_config()->set_heartbeat_interval_ms(60000);
    return request;
  };
  v1::JoinRequest gone =
      slow_beats(NodeJoin("late", "gone", 2, /*timeout_ms=*/600000));
  grpc::ClientContext context;
  grpc::Status gone_status;
  std::thread caller([&] {
    v1::JoinResponse response;
    gone_status = stub_->Join(&context, gone, &response);
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        return Counter(relay_->counters().upstream_join_calls) == 1 &&
               Job("late").has_value();
      },
      absl::Seconds(10)));
  context.TryCancel();
  caller.join();
  EXPECT_EQ(gone_status.error_code(), grpc::StatusCode::CANCELLED);
  // The round closes with "gone" (its batch was parked upstream) ...
  std::vector<v1::JoinResponse> answers =
      JoinAll(direct_.get(), {slow_beats(NodeJoin("late", "b", 2, 600000))});
  ASSERT_TRUE(answers[0].has_assignment());
  // ... and the relay's Leave ends it at once: b is told to rejoin.
  v1::HeartbeatRequest beat;
  beat.set_run_id("late");
  beat.set_node_id("b");
  beat.set_round(answers[0].assignment().round());
  EXPECT_TRUE(WaitFor(
      [&] {
        v1::HeartbeatResponse response;
        auto c = BoundedContext();
        return direct_->Heartbeat(c.get(), beat, &response).ok() &&
               response.rejoin();
      },
      absl::Seconds(10)));
  EXPECT_EQ(Counter(relay_->counters().leaves_for_cancelled), 1);
}

TEST_F(RelayTest, AnUpstreamNotListeningIsUnavailableNamingIt) {
  // A port that was just listening, and no more.
  StartServer();
  std::string upstream = server_->endpoint();
  server_->Shutdown();
  server_.reset();
  StartRelay(/*max_batch=*/4, absl::Milliseconds(2), upstream);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the relay survives
    v1::JoinResponse response;
    auto context = BoundedContext();
    grpc::Status status =
        stub_->Join(context.get(), NodeJoin("down", "n0", 1), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(status.error_message().find(upstream), std::string::npos)
        << status.error_message();

    v1::StatusResponse status_response;
    auto other = BoundedContext();
    status = stub_->Status(other.get(), v1::StatusRequest(), &status_response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(status.error_message().find(upstream), std::string::npos)
        << status.error_message();

    v1::HeartbeatRequest beat;
    beat.set_run_id("down");
    beat.set_node_id("n0");
    v1::HeartbeatResponse beat_response;
    auto third = BoundedContext();
    status = stub_->Heartbeat(third.get(), beat, &beat_response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(status.error_message().find(upstream), std::string::npos)
        << status.error_message();
  }
}

// A server older than batches: Join and the Heartbeats stream ignore
// `more` and answer the message's own node only.
class OldServer : public v1::Rendezvous::CallbackService {
 public:
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override {
    joins_.fetch_add(1);
    response->mutable_assignment()->set_round(1);
    response->mutable_assignment()->set_node_rank(ranks_.fetch_add(1));
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
  Heartbeats(grpc::CallbackServerContext* /*context*/) override {
    class Stream : public grpc::ServerBidiReactor<v1::HeartbeatRequest,
                                                  v1::HeartbeatResponse> {
     public:
      explicit Stream(OldServer* server) : server_(server) {
        StartRead(&request_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        server_->messages_.fetch_add(1);
        response_.set_round(1);
        response_.set_state(v1::JOB_STATE_RUNNING);
        StartWrite(&response_);
      }
      void OnWriteDone(bool ok) override {
        if (ok) {
          StartRead(&request_);
        } else {
          Finish(grpc::Status::OK);
        }
      }
      void OnDone() override { delete this; }

     private:
      OldServer* const server_;
      v1::HeartbeatRequest request_;
      v1::HeartbeatResponse response_;
    };
    return new Stream(this);
  }
  std::atomic<int> joins_{0};
  std::atomic<int> ranks_{0};
  std::atomic<int> messages_{0};
};

TEST_F(RelayTest, AnOldServerGetsTheRestOneByOne) {
  OldServer old;
  std::string upstream;
  std::unique_ptr<grpc::Server> server = StartFakeServer(&old, &upstream);
  ASSERT_NE(server, nullptr);
  direct_ = v1::Rendezvous::NewStub(
      grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()));
  StartRelay(/*max_batch=*/4, absl::Minutes(5), upstream);
  std::vector<v1::JoinRequest> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(NodeJoin("old", absl::StrCat("n", i), 4));
  }
  std::vector<v1::JoinResponse> answers = JoinAll(stub_.get(), nodes);
  std::set<int> ranks;
  for (const auto& answer : answers) {
    ASSERT_TRUE(answer.has_assignment()) << answer.DebugString();
    ranks.insert(answer.assignment().node_rank());
  }
  EXPECT_EQ(ranks.size(), 4u);
  // One batch (the first node joined), then the three others singly.
  EXPECT_EQ(old.joins_.load(), 4);
  EXPECT_EQ(Counter(relay_->counters().upstream_join_calls), 4);

  // Heartbeats: three callers' beats in one message, answered for the
  // first only; the other two are sent again, one per message.
  relay_->Shutdown();
  StartRelay(/*max_batch=*/3, absl::Minutes(5), upstream);
  std::vector<std::thread> beaters;
  std::vector<grpc::Status> statuses(3);
  std::vector<v1::HeartbeatResponse> responses(3);
  for (int i = 0; i < 3; ++i) {
    beaters.emplace_back([&, i] {
      v1::HeartbeatRequest beat;
      beat.set_run_id("old");
      beat.set_node_id(absl::StrCat("n", i));
      auto context = BoundedContext();
      statuses[i] = stub_->Heartbeat(context.get(), beat, &responses[i]);
    });
  }
  for (auto& t : beaters) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(responses[i].round(), 1);
  }
  EXPECT_EQ(old.messages_.load(), 3);
  EXPECT_EQ(Counter(relay_->counters().upstream_beat_messages), 3);
  relay_->Shutdown();
  server->Shutdown();
}

TEST_F(RelayTest, WithoutAnUpstreamStreamTheRelayBeatsUnary) {
  // A server older than the Heartbeats stream (and than `more`).
  NoStreamServer old(/*round=*/7);
  std::string upstream;
  std::unique_ptr<grpc::Server> server = StartFakeServer(&old, &upstream);
  ASSERT_NE(server, nullptr);
  StartRelay(/*max_batch=*/64, absl::Milliseconds(2), upstream);
  v1::HeartbeatRequest beat;
  beat.set_run_id("old");
  beat.set_node_id("n0");
  // The first beat finds out (the stream is UNIMPLEMENTED): UNAVAILABLE,
  // beat again; the next ones are unary upstream.
  bool answered = WaitFor(
      [&] {
        v1::HeartbeatResponse response;
        auto context = BoundedContext();
        grpc::Status status = stub_->Heartbeat(context.get(), beat, &response);
        EXPECT_TRUE(status.ok() ||
                    status.error_code() == grpc::StatusCode::UNAVAILABLE)
            << status.error_message();
        return status.ok() && response.round() == 7;
      },
      absl::Seconds(10), absl::Milliseconds(50));
  EXPECT_TRUE(answered);
  EXPECT_GE(old.unary.load(), 1);
  relay_->Shutdown();
  server->Shutdown();
}

TEST(JoinFanoutTest, SplitsABatchedAnswerAndItsErrors) {
  v1::JoinResponse response;
  response.mutable_assignment()->set_round(3);
  response.add_more()->mutable_error()->set_code(
      static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  response.mutable_more(0)->mutable_error()->set_message("bad config");
  response.add_more()->mutable_waiting()->set_round(3);
  auto outcomes = SplitJoinAnswer(grpc::Status::OK, response, 3, "up:1");
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_TRUE(outcomes[0].status.ok());
  EXPECT_EQ(outcomes[0].response.assignment().round(), 3);
  EXPECT_EQ(outcomes[0].response.more_size(), 0);
  EXPECT_EQ(outcomes[1].status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(outcomes[1].status.error_message(), "bad config");
  EXPECT_TRUE(outcomes[2].response.has_waiting());
}

TEST(JoinFanoutTest, AnOldServerAnswersOnlyTheFirstNode) {
  v1::JoinResponse response;
  response.mutable_assignment()->set_round(1);
  auto outcomes = SplitJoinAnswer(grpc::Status::OK, response, 4, "up:1");
  EXPECT_EQ(outcomes.size(), 1u);  // the batcher resends the other three
}

TEST(JoinFanoutTest, AFailedCallEndsEveryCallerAndUnavailableNamesUpstream) {
  auto outcomes = SplitJoinAnswer(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"),
      v1::JoinResponse(), 2, "rdzv:29400");
  ASSERT_EQ(outcomes.size(), 2u);
  for (const JoinOutcome& outcome : outcomes) {
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(outcome.status.error_message().find("rdzv:29400"),
              std::string::npos);
  }
  outcomes = SplitJoinAnswer(
      grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no token"),
      v1::JoinResponse(), 2, "rdzv:29400");
  EXPECT_EQ(outcomes[1].status.error_message(), "no token");
}

}  // namespace
}  // namespace ddprun::relay
