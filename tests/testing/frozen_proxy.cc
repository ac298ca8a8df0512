#include "tests/testing/frozen_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>

namespace ddprun::testing {

FrozenProxy::FrozenProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listen_fd_, 16);
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
}

FrozenProxy::~FrozenProxy() {
  stop_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  for (auto& t : threads_) t.join();
  for (int fd : fds_) close(fd);
  close(listen_fd_);
}

void FrozenProxy::Accept() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(upstream_port_);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
        0) {
      close(client);
      close(server);
      continue;
    }
    // Only the acceptor thread touches fds_ and threads_ until the
    // destructor joins it.
    fds_.push_back(client);
    fds_.push_back(server);
    threads_.emplace_back([this, client, server] { Pump(client, server); });
    threads_.emplace_back([this, client, server] { Pump(server, client); });
  }
}

void FrozenProxy::Pump(int from, int to) {
  char buffer[16384];
  while (!stop_) {
    if (frozen_) {
      usleep(10000);  // hold the socket open, move nothing
      continue;
    }
    pollfd p{from, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    if (frozen_) continue;
    ssize_t n = read(from, buffer, sizeof(buffer));
    if (n <= 0) return;
    for (ssize_t off = 0; off < n;) {
      // MSG_NOSIGNAL: a peer gone is an error here, not a SIGPIPE.
      ssize_t w = send(to, buffer + off, n - off, MSG_NOSIGNAL);
      if (w <= 0) return;
      off += w;
    }
  }
}

}  // namespace ddprun::testing
