#include "launcher/posix/local_address.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace ddprun::launcher {
namespace {

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// The source address the kernel would use to reach host:port (a UDP
// connect sends nothing).
std::string RouteSourceAddress(const common::Endpoint& to) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  std::string port = std::to_string(to.port);
  if (getaddrinfo(to.host.c_str(), port.c_str(), &hints, &result) != 0) {
    return "";
  }
  std::string address;
  for (addrinfo* ai = result; ai != nullptr && address.empty();
       ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      if (local.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr,
                  text, sizeof(text));
      } else {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr,
                  text, sizeof(text));
      }
      address = text;
    }
    close(fd);
  }
  freeaddrinfo(result);
  return address;
}

}  // namespace

std::string DefaultLocalAddress(const common::Endpoint& rendezvous) {
  if (IsLoopback(rendezvous.host)) return "127.0.0.1";
  // A wildcard (this agent serves on every interface) routes to loopback,
  // which other nodes cannot dial: torchrun's default, the host name.
  if (rendezvous.host == "0.0.0.0" || rendezvous.host == "::" ||
      rendezvous.host.empty()) {
    return HostName();
  }
  std::string routed = RouteSourceAddress(rendezvous);
  if (!routed.empty()) return routed;
  return HostName();
}

absl::Status CheckHostResolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc == 0) {
    freeaddrinfo(result);
    return absl::OkStatus();
  }
  if (rc == EAI_AGAIN || rc == EAI_SYSTEM || rc == EAI_MEMORY) {
    return absl::OkStatus();  // the resolver failed for now; gRPC retries
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--rdzv-endpoint: the host '%s' does not resolve (%s); check its "
      "spelling, or give its IP address",
      host, gai_strerror(rc)));
}

absl::StatusOr<HeldPort> HeldPort::Bind(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(address.c_str(), "0", &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot resolve this node's address '%s': %s; give --local-addr with "
        "an address of this host",
        address, gai_strerror(rc)));
  }
  std::string error = "no usable address";
  int held_fd = -1;
  int port = -1;
  for (addrinfo* ai = result; ai != nullptr && port < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // The workers' TCPStore sets it too, so it may bind the port even
    // before Release.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = bound.ss_family == AF_INET
                 ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                 : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      held_fd = fd;
    } else {
      error = strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(result);
  if (port < 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot bind a port on this node's address '%s': %s; give "
        "--local-addr with an address of this host",
        address, error));
  }
  return HeldPort(held_fd, port);
}

HeldPort& HeldPort::operator=(HeldPort&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

void HeldPort::Release() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool CanListenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  std::string port_text = std::to_string(port);
  if (getaddrinfo(host.c_str(), port_text.c_str(), &hints, &result) != 0) {
    return false;
  }
  bool can = false;
  for (addrinfo* ai = result; ai != nullptr && !can; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    can = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(result);
  return can;
}

absl::StatusOr<int> ReservePort(const std::string& address) {
  absl::StatusOr<HeldPort> held = HeldPort::Bind(address);
  if (!held.ok()) return held.status();
  return held->port();
}

bool WaitUntilListening(const std::string& host, int port, absl::Duration max) {
  absl::Time deadline = absl::Now() + max;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  std::string port_text = std::to_string(port);
  if (getaddrinfo(host.c_str(), port_text.c_str(), &hints, &result) != 0) {
    return false;
  }
  bool listening = false;
  while (!listening && absl::Now() < deadline) {
    for (addrinfo* ai = result; ai != nullptr && !listening; ai = ai->ai_next) {
      int fd =
          socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc == 0) {
        listening = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int wait_ms = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 100));
        int error = 0;
        socklen_t len = sizeof(error);
        if (poll(&p, 1, wait_ms) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
            error == 0) {
          listening = true;
        }
      }
      close(fd);
    }
    if (!listening) absl::SleepFor(absl::Milliseconds(2));
  }
  freeaddrinfo(result);
  return listening;
}

std::string MakeNodeId() {
  absl::BitGen gen;
  return absl::StrFormat("%s:%d:%06x", HostName(), getpid(),
                         absl::Uniform<uint32_t>(gen, 0, 1u << 24));
}

}  // namespace ddprun::launcher
