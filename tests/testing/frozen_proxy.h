#pragma once

#include <atomic>
#include <thread>
#include <vector>

namespace ddprun::testing {

// A TCP proxy on a kernel-picked loopback port that forwards every
// connection to `upstream_port` until Freeze(): then it stops moving bytes
// in both directions but keeps the sockets open, as a host that died or was
// cut off does (no FIN, no RST). Thaw() plugs the cable back in: bytes move
// again, and a connection the upstream closed meanwhile stays open and
// silent on the client's side (the close was lost with the cable: the
// client must find out by itself). Closes everything when destroyed.
class FrozenProxy {
 public:
  explicit FrozenProxy(int upstream_port);
  ~FrozenProxy();
  FrozenProxy(const FrozenProxy&) = delete;
  FrozenProxy& operator=(const FrozenProxy&) = delete;

  int port() const { return port_; }
  void Freeze() { frozen_ = true; }
  void Thaw() { frozen_ = false; }

 private:
  void Accept();
  void Pump(int from, int to);

  int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stop_{false};
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace ddprun::testing
