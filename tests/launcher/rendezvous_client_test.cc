// The agent's rendezvous client against a real server, through a cable that
// a test pulls (tests/testing/frozen_proxy.h): what a partition does to a
// call in flight.
#include "launcher/agent/rendezvous_client.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/testing/frozen_proxy.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::ddprun::testing::WaitFor;

v1::JoinRequest TwoNodeJoin(const std::string& node) {
  v1::JoinRequest request;
  request.set_run_id("cut-off");
  request.set_node_id(node);
  request.set_local_world_size(1);
  request.set_node_rank(-1);
  request.set_address("host-" + node);
  request.set_master_port(node == "a" ? 5001 : 5002);
  request.mutable_config()->set_min_nodes(2);
  request.mutable_config()->set_max_nodes(2);
  return request;
}

// The soak's stall: a node's Join was parked when its cable was pulled; the
// server dropped the silent connection (its keepalive), and the close was
// lost with the cable. Without the client's own keepalive the agent held a
// dead call for its join timeout (minutes) while the job waited for its
// node. Now its next ping finds the connection dead, and the Join is sent
// again over a new one once the cable is back: the round forms.
TEST(RendezvousClientTest, AJoinWhoseConnectionDiedUnseenIsSentAgain) {
  rendezvous::ServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.port = 0;
  // The server drops a silent connection fast.
  server_options.keepalive_time = absl::Milliseconds(200);
  server_options.keepalive_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  testing::FrozenProxy cable((*server)->port());

  RendezvousClientOptions through_cable;
  through_cable.endpoint = absl::StrCat("127.0.0.1:", cable.port());
  absl::StatusOr<std::unique_ptr<RendezvousClient>> a =
      RendezvousClient::Create(through_cable);
  ASSERT_TRUE(a.ok()) << a.status();
  const absl::Duration join_timeout = absl::Minutes(5);
  absl::Mutex mu;
  std::optional<absl::StatusOr<v1::JoinResponse>> a_joined;
  std::thread a_joins([&] {
    absl::StatusOr<v1::JoinResponse> joined =
        (*a)->Join(TwoNodeJoin("a"), join_timeout, absl::Minutes(1));
    absl::MutexLock lock(&mu);
    a_joined = std::move(joined);
  });
  // Whatever fails below, a's Join ends with the test.
  absl::Cleanup end_a = [&] {
    (*a)->CancelJoin();
    a_joins.join();
  };
  auto parked = [&] { return (*server)->NumParkedCallsForTest(); };
  ASSERT_TRUE(WaitFor([&] { return parked() == 1; }, absl::Seconds(30)))
      << "a's Join never parked";

  cable.Freeze();
  ASSERT_TRUE(WaitFor([&] { return parked() == 0; }, absl::Seconds(30)))
      << "the server kept a's silent connection";
  cable.Thaw();
  const absl::Time thawed = absl::Now();

  // b joins directly; the round closes only with a's Join live again.
  RendezvousClientOptions direct;
  direct.endpoint = (*server)->endpoint();
  absl::StatusOr<std::unique_ptr<RendezvousClient>> b =
      RendezvousClient::Create(direct);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<v1::JoinResponse> b_joined =
      (*b)->Join(TwoNodeJoin("b"), absl::Seconds(40), absl::Seconds(10));
  ASSERT_TRUE(b_joined.ok()) << b_joined.status();
  EXPECT_TRUE(b_joined->has_assignment()) << b_joined->DebugString();
  const absl::Duration took = absl::Now() - thawed;
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock lock(&mu);
        return a_joined.has_value();
      },
      absl::Seconds(30)))
      << "b has its assignment, a never got its own";
  std::move(end_a).Invoke();
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(a_joined->ok()) << a_joined->status();
  EXPECT_TRUE((*a_joined)->has_assignment()) << (*a_joined)->DebugString();
  // The keepalive's bound (a ping every 2 s, 1 s for its answer), far from
  // the join timeout the dead call would have waited.
  EXPECT_LT(took, absl::Seconds(30));
}

}  // namespace
}  // namespace ddprun::launcher
