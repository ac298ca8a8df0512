// The heartbeat loop with a real rendezvous server, and with one that cannot
// be reached: a node whose heartbeats all fail for the heartbeat timeout
// knows that its round is over (the server has dropped it).
#include "launcher/agent/heartbeat_loop.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "launcher/agent/rendezvous_client.h"
#include "rendezvous/server.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

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
  HeartbeatLoopOptions options;
  options.run_id = "cut-off";
  options.node_id = "n0";
  options.round = 3;
  options.interval = absl::Milliseconds(50);
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
  HeartbeatLoopOptions options;
  options.run_id = "alive";
  options.node_id = "n0";
  options.round = joined->assignment().round();
  options.interval = absl::Milliseconds(50);
  options.timeout = absl::Milliseconds(300);
  std::atomic<int> calls = 0;
  HeartbeatLoop loop(*client, options, [&] { ++calls; });
  // Several timeouts long: only answered heartbeats keep it from firing.
  EXPECT_FALSE(WaitFor([&] { return calls > 0; }, absl::Milliseconds(1500)));
}

}  // namespace
}  // namespace ddprun::launcher
