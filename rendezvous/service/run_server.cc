#include "rendezvous/service/run_server.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/credentials.h"
#include "common/endpoint.h"
#include "common/metrics.h"
#include "common/service_main.h"
#include "common/worker_env.h"
#include "rendezvous/core/limits.h"
#include "rendezvous/service/job_page.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {

bool IsLoopbackHost(const std::string& host) {
  return common::IsLoopbackHost(host);
}

absl::Status CheckListenIsAuthenticated(const RunServerOptions& options,
                                        const std::string& token) {
  const ServerOptions& server = options.server;
  if (options.insecure || !token.empty() || IsLoopbackHost(server.host) ||
      !server.tls.client_ca_file.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "refusing to listen on %s without a token: any host that reaches the "
      "port could join jobs and read or overwrite their store. Give "
      "--token-file (or %s), or mutual TLS (--tls-client-ca-file); or, on a "
      "network only trusted hosts reach, add --insecure",
      server.host, common::env::kToken));
}

int RunServerUntilSignal(const RunServerOptions& options) {
  // Before gRPC starts its threads.
  common::StopSignals stop;
  // Debian builds Abseil without NDEBUG, so every absl::Mutex (gRPC's own
  // included) keeps a deadlock-detection graph: a graph node per mutex
  // created and a walk per nested lock. With 100,000 parked calls that was
  // ~8 % of the server's CPU. Deadlocks are a test-time concern: the tests
  // keep the default.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (absl::Status limits = ValidateLimits(options.server.limits);
      !limits.ok()) {
    spdlog::error("ddprun-rendezvous: {}", std::string(limits.message()));
    return 2;
  }
  absl::StatusOr<std::string> token = common::LoadToken(options.token_file);
  if (!token.ok()) {
    spdlog::error("ddprun-rendezvous: {}", token.status().ToString());
    return 1;
  }
  if (absl::Status safe = CheckListenIsAuthenticated(options, *token);
      !safe.ok()) {
    spdlog::error("ddprun-rendezvous: {}", safe.ToString());
    return 1;
  }
  // Declared before the server and its metrics endpoint: both use it.
  common::MetricsRegistry registry;
  ServerOptions server_options = options.server;
  if (options.metrics_port >= 0) server_options.metrics = &registry;
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
  if (server_options.token.empty() && !IsLoopbackHost(options.server.host)) {
    spdlog::warn(
        "ddprun-rendezvous: --insecure: no token (--token-file or {}): any "
        "client that reaches this port can join jobs and use the store",
        common::env::kToken);
  }
  absl::StatusOr<std::unique_ptr<common::MetricsServer>> metrics =
      common::StartAnnouncedMetrics(
          "ddprun-rendezvous", options.metrics_host, options.metrics_port,
          &registry, [raw = server->get()](const std::string& target) {
            return JobPage(target, [raw](const v1::StatusRequest& request) {
              return raw->JobStatus(request);
            });
          });
  if (!metrics.ok()) {
    spdlog::error("ddprun-rendezvous: {}", metrics.status().ToString());
    return 1;
  }
  stop.Wait("ddprun-rendezvous");
  // No scrape may read the server's state while it goes away.
  if (*metrics != nullptr) (*metrics)->Shutdown();
  (*server)->Shutdown();
  return 0;
}

}  // namespace ddprun::rendezvous
