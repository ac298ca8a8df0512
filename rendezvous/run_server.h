#pragma once

#include "rendezvous/server.h"

namespace ddprun::rendezvous {

struct RunServerOptions {
  ServerOptions server;
  // The shared token's file; empty: DDPRUN_TOKEN from the environment, or
  // no token when that is unset too.
  std::string token_file;
  // Serve Prometheus /metrics on this port; 0: the kernel picks; -1: off.
  int metrics_port = -1;
  // Empty: the server's --host.
  std::string metrics_host;
};

// What ddprun-rendezvous does: starts the server, prints
// "ddprun-rendezvous listening on HOST:PORT" as the first stdout line
// (flushed, for scripts and tests), serves until SIGINT or SIGTERM, then
// shuts down. Returns the process exit code. Call from main before any other
// thread exists: it blocks the two signals for every thread it starts.
int RunServerUntilSignal(const RunServerOptions& options);

}  // namespace ddprun::rendezvous
