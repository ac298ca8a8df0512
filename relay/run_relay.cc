#include "relay/run_relay.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/endpoint.h"
#include "common/service_main.h"
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
  // Before gRPC starts its threads.
  common::StopSignals stop;
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
  absl::StatusOr<std::unique_ptr<common::MetricsServer>> metrics =
      common::StartAnnouncedMetrics("ddprun-relay", options.metrics_host,
                                    options.metrics_port, &(*relay)->metrics());
  if (!metrics.ok()) {
    spdlog::error("ddprun-relay: {}", metrics.status().ToString());
    return 1;
  }
  stop.Wait("ddprun-relay");
  if (*metrics != nullptr) (*metrics)->Shutdown();
  (*relay)->Shutdown();
  return 0;
}

}  // namespace ddprun::relay
