// The heartbeat loop with a real rendezvous server, and with one that cannot
// be reached: a node whose heartbeats all fail for the heartbeat timeout
// knows that its round is over (the server has dropped it). Heartbeats go on
// the server's stream (Rendezvous.Heartbeats); a server older than it gets
// unary heartbeats; a restarted server gets the round back (Resume) and a
// new stream. One test drives the loop against the shared fake rendezvous
// (tests/testing/fake_rendezvous.h); its decisions are HeartbeatPolicy's,
// tested on a fake clock in heartbeat_policy_test.cc.
#include "launcher/agent/heartbeat_loop.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "launcher/agent/rendezvous_client.h"
#include "rendezvous/service/server.h"
#include "tests/testing/fake_rendezvous.h"
#include "tests/testing/frozen_proxy.h"
#include "tests/testing/old_servers.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::ddprun::testing::NoStreamServer;
using ::ddprun::testing::StartFakeServer;
using ::ddprun::testing::WaitFor;

// A loopback port that refuses connections: bound, never listening, held
// for the test's lifetime so that nothing else takes it.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~RefusingPort() { close(fd_); }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The loop's options for node "n0" of `run_id` in `round`, beating every
// `interval` (the timeout, when a test needs one, is set by the test).
HeartbeatLoopOptions LoopOptions(const std::string& run_id, int64_t round,
                                 absl::Duration interval) {
  HeartbeatLoopOptions options;
  options.run_id = run_id;
  options.node_id = "n0";
  options.round = round;
  options.interval = interval;
  return options;
}

std::unique_ptr<RendezvousClient> Client(const std::string& endpoint) {
  RendezvousClientOptions options;
  options.endpoint = endpoint;
  options.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      RendezvousClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

TEST(HeartbeatLoopTest, AnUnreachableServerEndsTheRoundAfterTheTimeout) {
  RefusingPort port;
  std::unique_ptr<RendezvousClient> client = Client(port.endpoint());
  HeartbeatLoopOptions options =
      LoopOptions("cut-off", 3, absl::Milliseconds(50));
  options.timeout = absl::Milliseconds(500);
  std::atomic<int> calls = 0;
  absl::Time start = absl::Now();
  std::atomic<int64_t> over_after_ms = -1;
  HeartbeatLoop loop(*client, options, [&] {
    over_after_ms = absl::ToInt64Milliseconds(absl::Now() - start);
    ++calls;
  });
  ASSERT_TRUE(WaitFor([&] { return calls > 0; }, absl::Seconds(10)));
  EXPECT_GE(over_after_ms, 500);
  EXPECT_EQ(calls, 1);
}

TEST(HeartbeatLoopTest, WithoutATimeoutFailedHeartbeatsAreRetried) {
  RefusingPort port;
  std::unique_ptr<RendezvousClient> client = Client(port.endpoint());
  HeartbeatLoopOptions options;
  options.interval = absl::Milliseconds(50);
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  EXPECT_FALSE(WaitFor([&] { return calls > 0; }, absl::Seconds(1)));
}

TEST(HeartbeatLoopTest, AnsweredHeartbeatsKeepTheRoundPastTheTimeout) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<RendezvousClient> client = Client((*server)->endpoint());
  v1::JoinRequest join;
  join.set_run_id("alive");
  join.set_node_id("n0");
  join.set_local_world_size(1);
  join.set_node_rank(-1);
  join.set_address("127.0.0.1");
  join.set_master_port(1);
  join.mutable_config()->set_min_nodes(1);
  join.mutable_config()->set_max_nodes(1);
  join.mutable_config()->set_heartbeat_interval_ms(50);
  join.mutable_config()->set_heartbeat_timeout_ms(5000);
  absl::StatusOr<v1::JoinResponse> joined =
      client->Join(join, absl::Seconds(10), absl::Seconds(10));
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(joined->has_assignment());
  HeartbeatLoopOptions options = LoopOptions(
      "alive", joined->assignment().round(), absl::Milliseconds(50));
  options.timeout = absl::Milliseconds(300);
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  // Several timeouts long: only answered heartbeats keep it from firing.
  EXPECT_FALSE(WaitFor([&] { return calls > 0; }, absl::Milliseconds(1500)));
}

// A one-node round of job `run_id` on `client`'s server; the Join request
// is returned in `join` (with the round's record, for Resume).
absl::StatusOr<v1::Assignment> JoinAlone(RendezvousClient& client,
                                         const std::string& run_id,
                                         v1::JoinRequest* join) {
  join->set_run_id(run_id);
  join->set_node_id("n0");
  join->set_local_world_size(1);
  join->set_node_rank(-1);
  join->set_address("127.0.0.1");
  join->set_master_port(1);
  join->mutable_config()->set_min_nodes(1);
  join->mutable_config()->set_max_nodes(1);
  join->mutable_config()->set_heartbeat_interval_ms(50);
  join->mutable_config()->set_heartbeat_timeout_ms(5000);
  absl::StatusOr<v1::JoinResponse> joined =
      client.Join(*join, absl::Seconds(10), absl::Seconds(10));
  if (!joined.ok()) return joined.status();
  if (!joined->has_assignment()) return absl::InternalError("no assignment");
  *join->mutable_record()->mutable_assignment() = joined->assignment();
  join->mutable_record()->set_restart_count(
      joined->assignment().restart_count());
  return joined->assignment();
}

TEST(HeartbeatLoopTest, HeartbeatsGoOnTheStream) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<RendezvousClient> client = Client((*server)->endpoint());
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "streamed", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("streamed", assignment->round(), absl::Milliseconds(20));
  std::atomic<int> calls = 0;
  {
    HeartbeatLoop loop(*client, options, [&] { ++calls; });
    // The fast path ran: the server counted beats on a stream, one stream.
    EXPECT_TRUE(
        WaitFor([&] { return (*server)->StreamedHeartbeatsForTest() >= 5; },
                absl::Seconds(20)));
    EXPECT_EQ((*server)->OpenHeartbeatStreamsForTest(), 1);
  }
  EXPECT_EQ(calls, 0);
  // The loop's end closed its stream.
  EXPECT_TRUE(
      WaitFor([&] { return (*server)->OpenHeartbeatStreamsForTest() == 0; },
              absl::Seconds(10)));
}

// The round's end reaches the loop when it comes, not at its next beat: its
// first beat goes on the stream at once (the server learns the node's
// round), and the server pushes the end on that stream. The interval is a
// minute, so only the push can end the round within the test's bound.
TEST(HeartbeatLoopTest, TheRoundsEndIsPushedBeforeTheNextBeat) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<RendezvousClient> client = Client((*server)->endpoint());
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "pushed", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("pushed", assignment->round(), absl::Minutes(1));
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  ASSERT_TRUE(
      WaitFor([&] { return (*server)->StreamedHeartbeatsForTest() == 1; },
              absl::Seconds(20)));

  v1::ReportFailureRequest fail;
  fail.set_run_id("pushed");
  fail.set_node_id("n0");
  fail.set_round(assignment->round());
  ASSERT_TRUE(client->ReportFailure(fail).ok());

  EXPECT_TRUE(WaitFor([&] { return calls > 0; }, absl::Seconds(20)));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ((*server)->HeartbeatPushesForTest(), 1);
  EXPECT_EQ((*server)->StreamedHeartbeatsForTest(), 1);  // no beat since
}

TEST(HeartbeatLoopTest, AServerWithoutTheStreamGetsUnaryHeartbeats) {
  // A server older than Rendezvous.Heartbeats.
  NoStreamServer old;
  std::string endpoint;
  std::unique_ptr<grpc::Server> server = StartFakeServer(&old, &endpoint);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<RendezvousClient> client = Client(endpoint);
  HeartbeatLoopOptions options = LoopOptions("old", 1, absl::Milliseconds(20));
  std::atomic<int> calls = 0;
  {
    HeartbeatLoop loop(*client, options, [&] { ++calls; });
    EXPECT_TRUE(WaitFor([&] { return old.unary >= 5; }, absl::Seconds(20)));
  }
  EXPECT_EQ(calls, 0);
  // The stream was tried once, and never again for the round.
  EXPECT_EQ(old.streams, 1);
  server->Shutdown();
}

TEST(HeartbeatLoopTest, AServerThatTakesNoMoreStreamsGetsUnaryHeartbeats) {
  rendezvous::ServerOptions no_streams;
  no_streams.max_heartbeat_streams = 0;
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(no_streams);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<RendezvousClient> client = Client((*server)->endpoint());
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "capped", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("capped", assignment->round(), absl::Milliseconds(20));
  options.timeout = absl::Seconds(2);
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  // Refused once; then unary beats keep the node alive (the job's status
  // shows it heard from lately) for longer than the loop's timeout.
  ASSERT_TRUE(
      WaitFor([&] { return (*server)->RefusedHeartbeatStreamsForTest() == 1; },
              absl::Seconds(20)));
  EXPECT_FALSE(WaitFor([&] { return calls > 0; }, absl::Seconds(3)));
  EXPECT_EQ((*server)->RefusedHeartbeatStreamsForTest(), 1);
  EXPECT_EQ((*server)->StreamedHeartbeatsForTest(), 0);
  absl::StatusOr<v1::StatusResponse> status = client->Status({});
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->jobs_size(), 1);
  ASSERT_EQ(status->jobs(0).nodes_size(), 1);
  EXPECT_LT(status->jobs(0).nodes(0).last_heartbeat_age_ms(), 1000);
}

// A server that stops answering with the connection open (a host cut off):
// the stream's beat is bounded by rpc_timeout, and the round ends once no
// heartbeat was answered for the timeout.
TEST(HeartbeatLoopTest, AStalledStreamEndsTheRoundAfterTheTimeout) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  testing::FrozenProxy proxy((*server)->port());
  std::unique_ptr<RendezvousClient> client =
      Client(absl::StrCat("127.0.0.1:", proxy.port()));
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "stalled", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("stalled", assignment->round(), absl::Milliseconds(20));
  options.timeout = absl::Seconds(1);
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  ASSERT_TRUE(
      WaitFor([&] { return (*server)->StreamedHeartbeatsForTest() >= 2; },
              absl::Seconds(20)));
  proxy.Freeze();
  EXPECT_TRUE(WaitFor([&] { return calls > 0; }, absl::Seconds(30)));
  EXPECT_EQ(calls, 1);
}

// Stops `server` and starts a new one on its port (the agent's endpoint);
// the kernel may hold the port a moment, so the start is retried for 10 s.
absl::StatusOr<std::unique_ptr<rendezvous::Server>> Restart(
    std::unique_ptr<rendezvous::Server>& server) {
  rendezvous::ServerOptions same_port;
  same_port.port = server->port();
  server->Shutdown();
  server.reset();
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> next =
      absl::UnavailableError("not started");
  WaitFor(
      [&] {
        next = rendezvous::Server::Start(same_port);
        return next.ok();
      },
      absl::Seconds(10));
  return next;
}

TEST(HeartbeatLoopTest, ARestartedServerGetsTheRoundBackAndANewStream) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> first =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  std::unique_ptr<RendezvousClient> client = Client((*first)->endpoint());
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "restarted", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("restarted", assignment->round(), absl::Milliseconds(20));
  options.resume = join;
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  ASSERT_TRUE(
      WaitFor([&] { return (*first)->StreamedHeartbeatsForTest() >= 2; },
              absl::Seconds(20)));
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> second = Restart(*first);
  ASSERT_TRUE(second.ok()) << second.status();
  // The stream broke; the node resumed its round on the new server and
  // streams there.
  EXPECT_TRUE(
      WaitFor([&] { return (*second)->StreamedHeartbeatsForTest() >= 2; },
              absl::Seconds(20)));
  EXPECT_EQ(calls, 0) << "the round ended instead of resuming";
}

// A server that restarts while the node's workers form their group (they
// exchange keys through the round's store) lost those keys: the round is
// taken back, and then over, so that it forms again.
TEST(HeartbeatLoopTest, ARestartWhileTheRoundFormsEndsTheRound) {
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> first =
      rendezvous::Server::Start(rendezvous::ServerOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  std::unique_ptr<RendezvousClient> client = Client((*first)->endpoint());
  v1::JoinRequest join;
  absl::StatusOr<v1::Assignment> assignment =
      JoinAlone(*client, "forming", &join);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  HeartbeatLoopOptions options =
      LoopOptions("forming", assignment->round(), absl::Milliseconds(20));
  options.resume = join;
  std::atomic<bool> forming = true;
  std::atomic<int> asked = 0;
  options.forming = [&] {
    ++asked;
    return forming.load();
  };
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  ASSERT_TRUE(
      WaitFor([&] { return (*first)->StreamedHeartbeatsForTest() >= 2; },
              absl::Seconds(20)));
  EXPECT_EQ(asked, 0) << "asked without a restart";
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> second = Restart(*first);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(WaitFor([&] { return calls > 0; }, absl::Seconds(20)))
      << "the round went on without the keys its workers exchanged";
  EXPECT_EQ(calls, 1);
  EXPECT_GE(asked, 1);
}

// Beats on a stream that ended at once (its server refuses the
// connection) fail cleanly, many times over, with a token (an interceptor
// on every call). The stream writes from outside gRPC's reactions, which
// gRPC allows only under a hold (ClientBidiReactor::AddHold): without one,
// gRPC freed the call's state when its last operation completed and only
// then scheduled OnDone, and a Beat in between wrote into freed state. The
// fault harness found that as an agent crash in the token's interceptor
// after a server restart; this test could not make the race happen on
// demand, so it guards the clean failure, not the race itself.
TEST(HeartbeatStreamClientTest,
     AStreamThatEndsAtOnceIsNeverWrittenAfterItsEnd) {
  RefusingPort port;
  RendezvousClientOptions options;
  options.endpoint = port.endpoint();
  options.channel.token = "stream-end-secret";
  options.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      RendezvousClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::HeartbeatRequest beat;
  beat.set_run_id("stream-end");
  beat.set_node_id("n0");
  beat.set_round(1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    absl::StatusOr<std::unique_ptr<HeartbeatStream>> stream =
        (*client)->OpenHeartbeatStream(nullptr);
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<v1::HeartbeatResponse> answer = (*stream)->Beat(beat);
      ASSERT_FALSE(answer.ok()) << "attempt " << attempt;
    }
  }
}

// The loop's wiring of HeartbeatPolicy, against the shared fake: a server
// that lost the job (NOT_FOUND) gets the node's record and the round goes
// on; its word that the round is over ends it, once.
TEST(HeartbeatLoopTest, ALostJobIsResumedAndTheServersWordEndsTheRound) {
  ::ddprun::testing::FakeRendezvous rdzv;
  std::atomic<bool> over_said = false;
  rdzv.heartbeat = [&](const v1::HeartbeatRequest& request,
                       int call) -> absl::StatusOr<v1::HeartbeatResponse> {
    v1::HeartbeatResponse r;
    r.set_round(request.round());
    r.set_state(v1::JOB_STATE_RUNNING);
    if (call == 2) return absl::NotFoundError("no job 'fake'");
    if (call == 6) {
      r.set_rejoin(true);
      over_said = true;
    }
    return r;
  };
  rdzv.resume = [](const v1::JoinRequest& request) {
    v1::ResumeResponse r;
    *r.mutable_assignment() = request.record().assignment();
    return absl::StatusOr<v1::ResumeResponse>(r);
  };
  HeartbeatLoopOptions options = LoopOptions("fake", 7, absl::Milliseconds(1));
  options.timeout = absl::Seconds(30);
  v1::JoinRequest record;
  record.set_run_id("fake");
  record.mutable_record()->mutable_assignment()->set_round(7);
  options.resume = record;
  std::atomic<int> calls = 0;
  std::atomic<int> heartbeats_at_over = -1;
  {
    HeartbeatLoop loop(rdzv, options, [&] {
      heartbeats_at_over = rdzv.heartbeat_count();
      ++calls;
    });
    ASSERT_TRUE(WaitFor([&] { return calls > 0; }, absl::Seconds(20)));
  }
  EXPECT_TRUE(over_said) << "the round ended before the server said so";
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(heartbeats_at_over, 7);
  EXPECT_EQ(rdzv.heartbeat_count(), 7) << "beats after the round was over";
  ASSERT_EQ(rdzv.resume_count(), 1);
  EXPECT_EQ(rdzv.resume_requests[0].record().assignment().round(), 7);
}

}  // namespace
}  // namespace ddprun::launcher
