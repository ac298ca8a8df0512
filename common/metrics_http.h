#pragma once

// Serves a MetricsRegistry at GET /metrics in the Prometheus text format,
// over plain HTTP (cpp-httplib), for a Prometheus server to scrape.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace ddprun::common {

struct MetricsServerOptions {
  // "0.0.0.0" / "::" to be scraped from other machines.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks one; read it back with port()
  std::string path = "/metrics";
};

// Owns one listening socket and the HTTP server thread(s). Start returns once
// the socket is bound and listening (a scrape that comes earlier than the
// accept loop waits in the backlog). Shutdown is idempotent; the destructor
// calls it. `registry` must outlive the server.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, const MetricsRegistry* registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "http://host:port/metrics", what a scraper fetches.
  std::string url() const;
  void Shutdown();

 private:
  MetricsServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  std::string path_;
  int port_ = 0;
};

}  // namespace ddprun::common
