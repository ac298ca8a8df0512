#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/endpoint.h"

namespace ddprun::launcher {

// This node's address as its peers reach it: 127.0.0.1 when the rendezvous is
// on loopback, else the address of the interface that routes to the
// rendezvous, else the host name's address. A wildcard rendezvous host (this
// agent serves on every interface) gives the host name, as torchrun's
// default does.
std::string DefaultLocalAddress(const common::Endpoint& rendezvous);

// A TCP port the kernel chose on this node's address (MASTER_PORT for node
// rank 0's workers, never guessed), held by a bound socket that does not
// listen, so that while a node waits for its round no other process is
// given the port (the kernel skips bound ports when it picks ephemeral ones,
// for bind(0) and connect alike). Release() it when the workers are about to
// bind it: torch's TCPStore (SO_REUSEADDR) could bind it while held, another
// program could not. The socket has SO_REUSEADDR and is close-on-exec.
// Move-only; owned by one thread.
class HeldPort {
 public:
  static absl::StatusOr<HeldPort> Bind(const std::string& address);
  HeldPort(HeldPort&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}
  HeldPort& operator=(HeldPort&& other) noexcept;
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  ~HeldPort() { Release(); }

  int port() const { return port_; }
  bool held() const { return fd_ >= 0; }
  // Closes the socket; the port stays known. Idempotent.
  void Release();

 private:
  HeldPort(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = -1;
};

// Whether this host could listen on host:port now: false when the address
// is not this host's or something listens there (SO_REUSEADDR, as gRPC
// binds: a port in TIME_WAIT counts as free). Decides torchrun's c10d
// is_host without a gRPC server's failed bind, which logs raw errors.
bool CanListenOn(const std::string& host, int port);

// HeldPort::Bind, released at once: a port the kernel chose, for callers
// that bind it themselves right away.
absl::StatusOr<int> ReservePort(const std::string& address);

// Whether something accepts TCP connections on host:port within `max`
// (tried every few milliseconds; each try bounded, so an unreachable host
// cannot block longer).
bool WaitUntilListening(const std::string& host, int port, absl::Duration max);

// OK when `host` resolves, or when the resolver only failed for now
// (EAI_AGAIN: a retry may succeed). INVALID_ARGUMENT, naming the host, when
// the name does not exist: no retry can reach it, so a typo in
// --rdzv-endpoint fails at once instead of after the unreachable wait.
absl::Status CheckHostResolves(const std::string& host);

// "host:pid:nonce", unique per agent process.
std::string MakeNodeId();

}  // namespace ddprun::launcher
