#pragma once

#include <string>

#include "absl/status/status.h"
#include "rendezvous/service/server.h"

namespace ddprun::rendezvous {

struct RunServerOptions {
  ServerOptions server;
  // The shared token's file; empty: DDPRUN_TOKEN from the environment, or
  // no token when that is unset too.
  std::string token_file;
  // Serve Prometheus /metrics on this port; 0: the kernel picks; -1: off.
  int metrics_port = -1;
  // /metrics needs no token and names every job: loopback unless told.
  std::string metrics_host = "127.0.0.1";
  // Listen beyond loopback without a token (and without mutual TLS).
  bool insecure = false;
};

// Whether `host` lets only this machine connect (127.0.0.0/8, ::1,
// localhost).
bool IsLoopbackHost(const std::string& host);

// Refuses (FAILED_PRECONDITION naming both fixes) to serve beyond loopback
// when neither a token (`token`, loaded) nor mutual TLS authenticates
// clients, unless options.insecure.
absl::Status CheckListenIsAuthenticated(const RunServerOptions& options,
                                        const std::string& token);

// What ddprun-rendezvous does: starts the server, prints
// "ddprun-rendezvous listening on HOST:PORT" as the first stdout line
// (flushed, for scripts and tests), serves until SIGINT or SIGTERM, then
// shuts down. Returns the process exit code. Call from main before any other
// thread exists: it blocks the two signals for every thread it starts.
int RunServerUntilSignal(const RunServerOptions& options);

}  // namespace ddprun::rendezvous
