#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/endpoint.h"

namespace ddprun::launcher {

// This node's address as its peers reach it: 127.0.0.1 when the rendezvous is
// on loopback, else the address of the interface that routes to the
// rendezvous, else the host name's address.
std::string DefaultLocalAddress(const common::Endpoint& rendezvous);

// Binds TCP port 0 on `address`, reads the port the kernel chose and closes
// the socket: MASTER_PORT for node rank 0's workers, never guessed.
absl::StatusOr<int> ReservePort(const std::string& address);

// Whether something accepts TCP connections on host:port within `max`
// (tried every few milliseconds; each try bounded, so an unreachable host
// cannot block longer).
bool WaitUntilListening(const std::string& host, int port, absl::Duration max);

// "host:pid:nonce", unique per agent process.
std::string MakeNodeId();

}  // namespace ddprun::launcher
