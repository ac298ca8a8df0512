// HeldPort: the MASTER_PORT offer an agent holds while it waits for its
// round. Real sockets on loopback.
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "gtest/gtest.h"
#include "launcher/posix/local_address.h"

namespace ddprun::launcher {
namespace {

// Binds 127.0.0.1:port (and listens); returns 0 or the errno.
int BindLoopback(int port, bool reuse_address) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  if (reuse_address) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int error = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 1) != 0) {
    error = errno;
  }
  close(fd);
  return error;
}

TEST(HeldPortTest, APlainBindCannotTakeItUntilItIsReleased) {
  absl::StatusOr<HeldPort> held = HeldPort::Bind("127.0.0.1");
  ASSERT_TRUE(held.ok()) << held.status();
  const int port = held->port();
  EXPECT_GT(port, 0);
  EXPECT_TRUE(held->held());
  EXPECT_EQ(BindLoopback(port, /*reuse_address=*/false), EADDRINUSE);

  held->Release();
  EXPECT_FALSE(held->held());
  EXPECT_EQ(held->port(), port);  // still the round's MASTER_PORT
  EXPECT_EQ(BindLoopback(port, /*reuse_address=*/false), 0);
}

TEST(HeldPortTest, TorchsStoreCanListenOnItWhileHeld) {
  // torch's TCPStore sets SO_REUSEADDR: a worker that binds before the
  // agent released the port still gets it.
  absl::StatusOr<HeldPort> held = HeldPort::Bind("127.0.0.1");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(BindLoopback(held->port(), /*reuse_address=*/true), 0);
}

TEST(HeldPortTest, MovingHandsTheSocketOver) {
  absl::StatusOr<HeldPort> held = HeldPort::Bind("127.0.0.1");
  ASSERT_TRUE(held.ok()) << held.status();
  const int port = held->port();
  HeldPort moved = std::move(*held);
  EXPECT_FALSE(held->held());
  EXPECT_TRUE(moved.held());
  EXPECT_EQ(BindLoopback(port, /*reuse_address=*/false), EADDRINUSE);
  { HeldPort gone = std::move(moved); }  // destroyed: released
  EXPECT_EQ(BindLoopback(port, /*reuse_address=*/false), 0);
}

TEST(HeldPortTest, AnAddressOfNoHostIsOneClearError) {
  absl::StatusOr<HeldPort> held = HeldPort::Bind("no-such-host.invalid");
  ASSERT_FALSE(held.ok());
  EXPECT_NE(held.status().message().find("--local-addr"), std::string::npos)
      << held.status();
}

}  // namespace
}  // namespace ddprun::launcher
