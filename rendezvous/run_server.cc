#include "rendezvous/run_server.h"

#include <signal.h>

#include <cstdio>

#include "common/credentials.h"
#include "common/worker_env.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {

int RunServerUntilSignal(const RunServerOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Blocked before gRPC starts its threads, so only sigwait below sees them.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::string> token = common::LoadToken(options.token_file);
  if (!token.ok()) {
    spdlog::error("ddprun-rendezvous: {}", token.status().ToString());
    return 1;
  }
  ServerOptions server_options = options.server;
  server_options.token = *token;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Start(server_options);
  if (!server.ok()) {
    spdlog::error("ddprun-rendezvous: {}", server.status().ToString());
    return 1;
  }
  std::printf("ddprun-rendezvous listening on %s\n",
              (*server)->endpoint().c_str());
  std::fflush(stdout);
  if (server_options.token.empty()) {
    spdlog::warn(
        "ddprun-rendezvous: no token (--token-file or {}): any client that "
        "reaches this port can join jobs and use the store",
        common::env::kToken);
  }

  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("ddprun-rendezvous: {} received; shutting down",
               received == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown();
  return 0;
}

}  // namespace ddprun::rendezvous
