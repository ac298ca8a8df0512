#include "rendezvous/run_server.h"

#include <signal.h>

#include <cstdio>

#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {

int RunServerUntilSignal(const ServerOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Blocked before gRPC starts its threads, so only sigwait below sees them.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  if (!server.ok()) {
    spdlog::error("ddprun-rendezvous: {}", server.status().ToString());
    return 1;
  }
  std::printf("ddprun-rendezvous listening on %s\n",
              (*server)->endpoint().c_str());
  std::fflush(stdout);

  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("ddprun-rendezvous: {} received; shutting down",
               received == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown();
  return 0;
}

}  // namespace ddprun::rendezvous
