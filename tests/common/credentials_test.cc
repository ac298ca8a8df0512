// common::CreateChannel bounds each connection attempt: one whose SYN
// nothing answers (a partition, a host cut off) is given up after
// ChannelOptions::connect_timeout_ms (and, with keepalive, the socket's
// TCP_USER_TIMEOUT) and tried again on a fresh socket, instead of waiting
// on the kernel's SYN retransmissions or gRPC's 20 s.
#include "common/credentials.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <string>

#include "common/unique_fd.h"
#include "grpcpp/channel.h"

namespace ddprun::common {
namespace {

// A loopback port whose SYNs are dropped: its listener's accept queue is
// full (backlog 0, one connection queued and never accepted), and Linux
// drops a SYN to a full queue without answering, as a cut cable does.
class SilentPort {
 public:
  SilentPort() {
    listener_.Reset(socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listener_.get(), 0) != 0 ||
        getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr),
                    &len) != 0) {
      return;
    }
    filler_.Reset(socket(AF_INET, SOCK_STREAM, 0));
    if (connect(filler_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  int port() const { return port_; }  // 0: could not be set up

 private:
  UniqueFd listener_;
  UniqueFd filler_;
  int port_ = 0;
};

// Starts the channel's first connection attempt and waits up to `wait` for
// it to leave CONNECTING; returns the state it is in then.
grpc_connectivity_state StateAfterConnecting(grpc::Channel& channel,
                                             std::chrono::seconds wait) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  const auto deadline = std::chrono::system_clock::now() + wait;
  while (state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_READY &&
         channel.WaitForStateChange(state, deadline)) {
    state = channel.GetState(false);
  }
  return state;
}

TEST(CredentialsTest, AConnectAttemptNothingAnswersIsGivenUpWithinItsBound) {
  SilentPort silent;
  ASSERT_NE(silent.port(), 0) << "could not fill a listener's accept queue";
  const std::string target = "127.0.0.1:" + std::to_string(silent.port());

  // The control: with neither bound (gRPC's 20 s, no keepalive and so no
  // TCP_USER_TIMEOUT) the attempt still waits after 3 s, so the port
  // really swallows SYNs rather than refusing them.
  ChannelOptions unbounded;
  unbounded.connect_timeout_ms = 0;
  unbounded.keepalive_time_ms = 0;
  auto waiting = CreateChannel(target, unbounded);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(StateAfterConnecting(**waiting, std::chrono::seconds(3)),
            GRPC_CHANNEL_CONNECTING);

  // The connect bound alone gives the attempt up (after 1 s; 10 s is the
  // bound of this test, not the figure), and so do the defaults, where
  // keepalive's TCP_USER_TIMEOUT ends the SYNs' wait too: the next attempt
  // is a fresh socket, whose first SYN goes out at once.
  ChannelOptions connect_bound;
  connect_bound.keepalive_time_ms = 0;
  ASSERT_EQ(connect_bound.connect_timeout_ms, 1000);
  ChannelOptions defaults;
  for (const ChannelOptions& options : {connect_bound, defaults}) {
    auto bounded = CreateChannel(target, options);
    ASSERT_TRUE(bounded.ok()) << bounded.status();
    EXPECT_EQ(StateAfterConnecting(**bounded, std::chrono::seconds(10)),
              GRPC_CHANNEL_TRANSIENT_FAILURE)
        << "keepalive " << options.keepalive_time_ms << " ms";
  }
}

}  // namespace
}  // namespace ddprun::common
