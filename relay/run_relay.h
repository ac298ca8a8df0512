#pragma once

#include <string>

#include "absl/status/status.h"
#include "relay/relay_options.h"

namespace ddprun::relay {

struct RunRelayOptions {
  RelayOptions relay;
  // Serve Prometheus /metrics on this port; 0: the kernel picks; -1: off.
  int metrics_port = -1;
  // /metrics needs no token: loopback unless told.
  std::string metrics_host = "127.0.0.1";
  // Listen beyond loopback without mutual TLS.
  bool insecure = false;
};

// Refuses (FAILED_PRECONDITION naming the fixes) to listen beyond loopback
// unless mutual TLS authenticates callers or options.insecure: the relay
// checks no token itself, and it would open the rendezvous server to any
// host that reaches the relay's port.
absl::Status CheckListenIsAuthenticated(const RunRelayOptions& options);

// What ddprun-relay does: starts the relay, prints "ddprun-relay listening
// on HOST:PORT" as the first stdout line (flushed, for scripts and tests),
// serves until SIGINT or SIGTERM, then shuts down. Returns the process exit
// code. Call from main before any other thread exists.
int RunRelayUntilSignal(const RunRelayOptions& options);

}  // namespace ddprun::relay
