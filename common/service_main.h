#pragma once

#include <signal.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "common/metrics_http.h"

namespace ddprun::common {

// What ddprun-rendezvous and ddprun-relay do around their gRPC service.

// SIGINT and SIGTERM, blocked by the constructor in the calling thread and
// so in every thread it starts afterwards: construct before gRPC starts its
// threads, so that only Wait sees them.
class StopSignals {
 public:
  StopSignals();
  // Returns once one arrives, logging "<program>: SIGTERM received;
  // shutting down" (or SIGINT).
  void Wait(const std::string& program);

 private:
  sigset_t signals_;
};

// With `port` >= 0: serves `registry` on http://host:port/metrics and prints
// "<program> metrics on URL" to stdout (flushed), the line tests and
// operators read the port from. With `port` < 0: nullptr, nothing started.
// `pages`: more read-only pages on the same port (MetricsServerOptions).
absl::StatusOr<std::unique_ptr<MetricsServer>> StartAnnouncedMetrics(
    const std::string& program, const std::string& host, int port,
    const MetricsRegistry* registry,
    std::function<std::optional<HttpPage>(const std::string&)> pages = {});

}  // namespace ddprun::common
