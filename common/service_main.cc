#include "common/service_main.h"

#include <pthread.h>

#include <cstdio>

#include "spdlog/spdlog.h"

namespace ddprun::common {

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

void StopSignals::Wait(const std::string& program) {
  int received = 0;
  sigwait(&signals_, &received);
  spdlog::info("{}: {} received; shutting down", program,
               received == SIGINT ? "SIGINT" : "SIGTERM");
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartAnnouncedMetrics(
    const std::string& program, const std::string& host, int port,
    const MetricsRegistry* registry,
    std::function<std::optional<HttpPage>(const std::string&)> pages) {
  if (port < 0) return nullptr;
  MetricsServerOptions options;
  options.pages = std::move(pages);
  options.host = host;
  options.port = port;
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      MetricsServer::Start(options, registry);
  if (!started.ok()) return started.status();
  std::printf("%s metrics on %s\n", program.c_str(), (*started)->url().c_str());
  std::fflush(stdout);
  return started;
}

}  // namespace ddprun::common
