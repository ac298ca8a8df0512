#pragma once

// Serves a MetricsRegistry at GET /metrics in the Prometheus text format,
// over plain HTTP, for a Prometheus server to scrape. A scrape is one small
// request and one answer, so the server is a few POSIX calls of its own: it
// needs no HTTP library, and the programs that serve it link statically.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "common/unique_fd.h"

namespace ddprun::common {

// A read-only page served next to /metrics (e.g. a job's live page).
struct HttpPage {
  std::string content_type;  // e.g. "text/html; charset=utf-8"
  std::string body;
};

struct MetricsServerOptions {
  // "0.0.0.0" / "::" to be scraped from other machines.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks one; read it back with port()
  std::string path = "/metrics";
  // Other GET paths (the query string cut off): the page, or nullopt for
  // 404. Called on the server's thread; set: the same listener, so the same
  // reach (host) as /metrics. Unset: only `path`.
  std::function<std::optional<HttpPage>(const std::string& target)> pages;
};

// Owns one listening socket and the one thread that accepts and answers
// scrapes, one connection at a time, each closed after its answer (a stalled
// client is dropped after a few seconds). Start returns once the socket is
// bound and listening (a scrape that comes earlier than the accept loop waits
// in the backlog). Shutdown is idempotent; the destructor calls it.
// `registry` must outlive the server.
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

  // The accept loop, on thread_.
  void Serve();

  const MetricsRegistry* registry_ = nullptr;
  UniqueFd listen_fd_;
  // Shutdown writes to its write end to end Serve's poll.
  PipeEnds wake_;
  std::thread thread_;
  std::string host_;
  std::string path_;
  std::function<std::optional<HttpPage>(const std::string&)> pages_;
  int port_ = 0;
};

}  // namespace ddprun::common
