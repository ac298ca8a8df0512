#include "relay/run_relay.h"

#include <signal.h>

#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/endpoint.h"
#include "common/metrics_http.h"
#include "relay/relay.h"
#include "spdlog/spdlog.h"

namespace ddprun::relay {

absl::Status CheckListenIsAuthenticated(const RunRelayOptions& options) {
  const RelayOptions& relay = options.relay;
  if (options.insecure || common::IsLoopbackHost(relay.host) ||
      !relay.tls.client_ca_file.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "refusing to listen on %s without mutual TLS: the relay checks no "
      "token of its own, so any host that reaches its port reaches the "
      "rendezvous server at %s through it. Give --tls-cert-file, "
      "--tls-key-file and --tls-client-ca-file; or, where the server checks "
      "tokens (--token-file) or only trusted hosts reach this port, add "
      "--insecure",
      relay.host, relay.upstream));
}

int RunRelayUntilSignal(const RunRelayOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Blocked before gRPC starts its threads, so only sigwait below sees them.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // As ddprun-rendezvous: Debian builds Abseil without NDEBUG, so every
  // absl::Mutex (gRPC's own included) keeps a deadlock-detection graph,
  // which costs every call; deadlocks are a test-time concern.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status safe = CheckListenIsAuthenticated(options); !safe.ok()) {
    spdlog::error("ddprun-relay: {}", safe.ToString());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Relay>> relay = Relay::Start(options.relay);
  if (!relay.ok()) {
    spdlog::error("ddprun-relay: {}", relay.status().ToString());
    return 1;
  }
  std::printf("ddprun-relay listening on %s\n", (*relay)->endpoint().c_str());
  std::fflush(stdout);
  std::unique_ptr<common::MetricsServer> metrics;
  if (options.metrics_port >= 0) {
    common::MetricsServerOptions metrics_options;
    metrics_options.host = options.metrics_host;
    metrics_options.port = options.metrics_port;
    auto started =
        common::MetricsServer::Start(metrics_options, &(*relay)->metrics());
    if (!started.ok()) {
      spdlog::error("ddprun-relay: {}", started.status().ToString());
      return 1;
    }
    metrics = std::move(*started);
    std::printf("ddprun-relay metrics on %s\n", metrics->url().c_str());
    std::fflush(stdout);
  }
  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("ddprun-relay: {} received; shutting down",
               received == SIGINT ? "SIGINT" : "SIGTERM");
  if (metrics != nullptr) metrics->Shutdown();
  (*relay)->Shutdown();
  return 0;
}

}  // namespace ddprun::relay
