// Polling Join end to end: the agent's RendezvousClient against a real
// server (gRPC on a kernel-picked port) that may park no Join, so that every
// node reaches its round by polling; and an older agent's Join (no `poll`)
// on the same server, still parked.
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "launcher/agent/rendezvous_client.h"
#include "rendezvous/service/server.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::ddprun::testing::WaitFor;

v1::JoinRequest JoinOf(const std::string& node) {
  v1::JoinRequest join;
  join.set_run_id("polls");
  join.set_node_id(node);
  join.set_local_world_size(2);
  join.set_node_rank(-1);
  join.set_address("127.0.0.1");
  join.set_master_port(1);
  v1::JobConfig* config = join.mutable_config();
  config->set_min_nodes(3);
  config->set_max_nodes(3);
  config->set_join_timeout_ms(60000);
  return join;
}

std::unique_ptr<RendezvousClient> Client(const std::string& endpoint) {
  RendezvousClientOptions options;
  options.endpoint = endpoint;
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      RendezvousClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

// Where one node of the job stands, by Status.
std::optional<v1::NodeState> StateOf(RendezvousClient& client,
                                     const std::string& node) {
  v1::StatusRequest request;
  request.set_run_id("polls");
  absl::StatusOr<v1::StatusResponse> status = client.Status(request);
  if (!status.ok() || status->jobs().empty()) return std::nullopt;
  for (const v1::NodeStatus& n : status->jobs(0).nodes()) {
    if (n.node_id() == node) return n.node_state();
  }
  return std::nullopt;
}

TEST(PollClientTest, NodesPastTheParkedCapReachTheirRoundByPolling) {
  rendezvous::ServerOptions options;
  options.max_parked_joins = 1;  // one Join parks; the others must poll
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();

  // An older agent: its Join has no `poll` and is parked (a raw stub, as
  // such an agent sends it).
  auto stub = v1::Rendezvous::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  grpc::ClientContext old_context;
  old_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::JoinResponse old_answer;
  absl::Mutex mu;
  std::optional<grpc::Status> old_status;
  const v1::JoinRequest old_join = JoinOf("old");
  stub->async()->Join(&old_context, &old_join, &old_answer,
                      [&](grpc::Status s) {
                        absl::MutexLock lock(&mu);
                        old_status = s;
                      });
  std::unique_ptr<RendezvousClient> probe = Client(endpoint);
  ASSERT_TRUE(WaitFor([&] { return StateOf(*probe, "old").has_value(); },
                      absl::Seconds(30)));

  // The parked slot is taken: a Join with `poll` is answered at once.
  {
    v1::JoinRequest join = JoinOf("raw");
    join.set_poll(true);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::JoinResponse answer;
    ASSERT_TRUE(stub->Join(&context, join, &answer).ok());
    ASSERT_TRUE(answer.has_waiting()) << answer.DebugString();
    EXPECT_EQ(answer.waiting().nodes_waiting(), 2);
    EXPECT_GT(answer.waiting().poll_interval_ms(), 0);
    // "raw" stops polling here: leave, so that it does not count.
    v1::LeaveRequest leave;
    leave.set_run_id("polls");
    leave.set_node_id("raw");
    leave.set_reason(v1::LeaveRequest::REASON_SHUTDOWN);
    ASSERT_TRUE(probe->Leave(leave).ok());
  }

  // Two agents: the first waits by polling (no slot), the second closes the
  // round and is answered at once; the first collects at its next poll.
  std::unique_ptr<RendezvousClient> a = Client(endpoint);
  std::unique_ptr<RendezvousClient> b = Client(endpoint);
  absl::StatusOr<v1::JoinResponse> a_answer;
  std::thread a_thread([&] {
    a_answer = a->Join(JoinOf("a"), absl::Seconds(60), absl::Seconds(10));
  });
  ASSERT_TRUE(
      WaitFor([&] { return StateOf(*probe, "a") == v1::NODE_STATE_JOINING; },
              absl::Seconds(30)));
  absl::StatusOr<v1::JoinResponse> b_answer =
      b->Join(JoinOf("b"), absl::Seconds(60), absl::Seconds(10));
  a_thread.join();
  ASSERT_TRUE(a_answer.ok()) << a_answer.status();
  ASSERT_TRUE(b_answer.ok()) << b_answer.status();
  ASSERT_TRUE(a_answer->has_assignment()) << a_answer->DebugString();
  ASSERT_TRUE(b_answer->has_assignment()) << b_answer->DebugString();
  {
    absl::MutexLock lock(&mu);
    auto answered = [&] { return old_status.has_value(); };
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(30)));
    ASSERT_TRUE(old_status->ok()) << old_status->error_message();
  }
  ASSERT_TRUE(old_answer.has_assignment());
  EXPECT_EQ(a_answer->assignment().world_size(), 6);
  EXPECT_EQ(b_answer->assignment().world_size(), 6);
  EXPECT_EQ(old_answer.assignment().world_size(), 6);
  EXPECT_EQ(a_answer->assignment().round(), 0);
  std::set<int> ranks = {a_answer->assignment().node_rank(),
                         b_answer->assignment().node_rank(),
                         old_answer.assignment().node_rank()};
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

// The server tells a waiting node to poll right after the round's expected
// close (here the last call), not at the plain interval; a poll sent when
// told collects the assignment at once, the round closed by that poll if
// the server's ticker had not closed it yet.
TEST(PollClientTest, AWaitingNodeIsToldToPollRightAfterTheLastCall) {
  rendezvous::ServerOptions options;
  options.max_parked_joins = 0;  // every Join with `poll` polls
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();
  auto stub = v1::Rendezvous::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  auto join_of = [](const std::string& node) {
    v1::JoinRequest join = JoinOf(node);
    join.mutable_config()->set_min_nodes(2);
    join.mutable_config()->set_max_nodes(4);
    join.mutable_config()->set_last_call_timeout_ms(1500);
    return join;
  };
  // Node "a" is the agent's client, polling as it is told.
  std::unique_ptr<RendezvousClient> a = Client(endpoint);
  absl::StatusOr<v1::JoinResponse> a_answer;
  std::thread a_thread([&] {
    a_answer = a->Join(join_of("a"), absl::Seconds(60), absl::Seconds(10));
  });
  std::unique_ptr<RendezvousClient> probe = Client(endpoint);
  ASSERT_TRUE(
      WaitFor([&] { return StateOf(*probe, "a") == v1::NODE_STATE_JOINING; },
              absl::Seconds(30)));

  // Node "b" brings the job to min_nodes: the last call ends 1.5 s later,
  // and that is when it is told to poll (within one poll interval after).
  v1::JoinRequest b = join_of("b");
  b.set_poll(true);
  v1::JoinResponse waiting;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ASSERT_TRUE(stub->Join(&context, b, &waiting).ok());
  }
  ASSERT_TRUE(waiting.has_waiting()) << waiting.DebugString();
  const int64_t interval = waiting.waiting().poll_interval_ms();
  EXPECT_GT(interval, 1000) << "told to wait for the last call, not 250 ms";
  EXPECT_LE(interval, 1500 + 250);
  EXPECT_GT(waiting.waiting().poll_timeout_ms(), interval);

  // It polls when told (the protocol's wait, not a guess): the assignment.
  absl::SleepFor(absl::Milliseconds(interval));
  v1::JoinResponse assigned;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ASSERT_TRUE(stub->Join(&context, b, &assigned).ok());
  }
  ASSERT_TRUE(assigned.has_assignment())
      << "a poll at the time given comes after the close: "
      << assigned.DebugString();
  a_thread.join();
  ASSERT_TRUE(a_answer.ok()) << a_answer.status();
  ASSERT_TRUE(a_answer->has_assignment()) << a_answer->DebugString();
  EXPECT_EQ(assigned.assignment().num_nodes(), 2);
  EXPECT_EQ(a_answer->assignment().num_nodes(), 2);
  EXPECT_NE(assigned.assignment().node_rank(),
            a_answer->assignment().node_rank());
}

// A Join run on its own thread; Ended() says whether it has returned.
class JoinThread {
 public:
  explicit JoinThread(std::function<absl::StatusOr<v1::JoinResponse>()> join)
      : thread_([this, join = std::move(join)] {
          absl::StatusOr<v1::JoinResponse> r = join();
          absl::MutexLock lock(&mu_);
          answer_ = std::move(r);
        }) {}
  ~JoinThread() { thread_.join(); }
  bool Ended() {
    absl::MutexLock lock(&mu_);
    return answer_.has_value();
  }
  // Waits (bounded) for the Join to return; nullopt when it did not.
  std::optional<absl::StatusOr<v1::JoinResponse>> Answer() {
    if (!WaitFor([this] { return Ended(); }, absl::Seconds(30))) {
      return std::nullopt;
    }
    absl::MutexLock lock(&mu_);
    return answer_;
  }

 private:
  absl::Mutex mu_;
  std::optional<absl::StatusOr<v1::JoinResponse>> answer_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// An in-place agent's Join (JoinUnless): each WakeJoin (a child of the agent
// changed state) has it ask its check again on the joining thread, and only
// the check's yes ends it; a no leaves the same Join waiting. Parked, or
// polling where another node holds the only parked slot.
class JoinUnlessTest : public ::testing::TestWithParam<bool> {};

TEST_P(JoinUnlessTest, AWakeAsksTheCheckAndOnlyItsYesEndsTheJoin) {
  const bool polls = GetParam();
  rendezvous::ServerOptions options;
  if (polls) options.max_parked_joins = 1;
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();
  std::unique_ptr<RendezvousClient> probe = Client(endpoint);
  std::unique_ptr<RendezvousClient> b = Client(endpoint);
  std::optional<JoinThread> b_join;
  if (polls) {  // b takes the parked slot: a polls
    b_join.emplace([&] {
      return b->Join(JoinOf("b"), absl::Seconds(60), absl::Seconds(10));
    });
    ASSERT_TRUE(
        WaitFor([&] { return StateOf(*probe, "b") == v1::NODE_STATE_JOINING; },
                absl::Seconds(30)));
  }

  std::unique_ptr<RendezvousClient> a = Client(endpoint);
  std::atomic<int> asks = 0;
  std::atomic<bool> leave = false;
  std::optional<JoinThread> a_join;
  a_join.emplace([&] {
    return a->JoinUnless(JoinOf("a"), absl::Seconds(60), absl::Seconds(10),
                         [&] {
                           ++asks;
                           return leave.load();
                         });
  });
  ASSERT_TRUE(
      WaitFor([&] { return StateOf(*probe, "a") == v1::NODE_STATE_JOINING; },
              absl::Seconds(30)));
  EXPECT_GE(asks.load(), 1) << "the check is asked before the Join is sent";

  // Woken, the check says stay: asked again, and the Join waits on.
  for (int i = 0; i < 3; ++i) {
    const int before = asks.load();
    a->WakeJoin();
    ASSERT_TRUE(
        WaitFor([&] { return asks.load() > before; }, absl::Seconds(10)))
        << "a wake did not ask the check";
  }
  EXPECT_FALSE(a_join->Ended());
  EXPECT_EQ(StateOf(*probe, "a"), v1::NODE_STATE_JOINING);

  leave = true;
  a->WakeJoin();
  std::optional<absl::StatusOr<v1::JoinResponse>> answer = a_join->Answer();
  ASSERT_TRUE(answer.has_value()) << "the check's yes did not end the Join";
  EXPECT_TRUE(IsJoinLeft(answer->status())) << answer->status();
  a_join.reset();

  // A check that says leave before the Join is sent: nothing is sent.
  const int before = asks.load();
  EXPECT_TRUE(IsJoinLeft(
      a->JoinUnless(JoinOf("a2"), absl::Seconds(60), absl::Seconds(10), [&] {
         ++asks;
         return true;
       }).status()));
  EXPECT_EQ(asks.load(), before + 1);
  EXPECT_EQ(StateOf(*probe, "a2"), std::nullopt);
  b->CancelJoin();
}

INSTANTIATE_TEST_SUITE_P(ParkedOrPolling, JoinUnlessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Polling" : "Parked";
                         });

// A fresh Join (no check: the agent has no workers) is never ended by a
// wake: Debian 13's Slurm test caught an earlier design that cancelled it on
// a stray SIGCHLD just as its round closed; the node lost its assignment,
// and its Join again ended the round. Here wakes keep coming while the round
// closes, and every node gets its place in the same round.
TEST(PollClientTest, WakesNeverEndAFreshJoin) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(rendezvous::ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();
  std::unique_ptr<RendezvousClient> probe = Client(endpoint);
  std::unique_ptr<RendezvousClient> a = Client(endpoint);
  std::unique_ptr<RendezvousClient> b = Client(endpoint);
  std::unique_ptr<RendezvousClient> c = Client(endpoint);
  std::optional<JoinThread> a_join;
  a_join.emplace([&] {
    return a->Join(JoinOf("a"), absl::Seconds(60), absl::Seconds(10));
  });
  ASSERT_TRUE(
      WaitFor([&] { return StateOf(*probe, "a") == v1::NODE_STATE_JOINING; },
              absl::Seconds(30)));
  std::atomic<bool> stop_waking = false;
  std::thread waker([&] {
    while (!stop_waking) a->WakeJoin();
  });
  JoinThread b_join([&] {
    return b->Join(JoinOf("b"), absl::Seconds(60), absl::Seconds(10));
  });
  absl::StatusOr<v1::JoinResponse> c_answer =
      c->Join(JoinOf("c"), absl::Seconds(60), absl::Seconds(10));
  std::optional<absl::StatusOr<v1::JoinResponse>> a_answer = a_join->Answer();
  stop_waking = true;
  waker.join();
  std::optional<absl::StatusOr<v1::JoinResponse>> b_answer = b_join.Answer();
  ASSERT_TRUE(a_answer.has_value());
  ASSERT_TRUE(b_answer.has_value());
  for (const absl::StatusOr<v1::JoinResponse>* answer :
       {&*a_answer, &*b_answer, &c_answer}) {
    ASSERT_TRUE(answer->ok()) << answer->status();
    ASSERT_TRUE((*answer)->has_assignment()) << (*answer)->DebugString();
    EXPECT_EQ((*answer)->assignment().round(), 0);
    EXPECT_EQ((*answer)->assignment().num_nodes(), 3);
  }
}

}  // namespace
}  // namespace ddprun::launcher
