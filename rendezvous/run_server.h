#pragma once

#include "rendezvous/server.h"

namespace ddprun::rendezvous {

// What ddprun-rendezvous does: starts the server, prints
// "ddprun-rendezvous listening on HOST:PORT" as the first stdout line
// (flushed, for scripts and tests), serves until SIGINT or SIGTERM, then
// shuts down. Returns the process exit code. Call from main before any other
// thread exists: it blocks the two signals for every thread it starts.
int RunServerUntilSignal(const ServerOptions& options);

}  // namespace ddprun::rendezvous
