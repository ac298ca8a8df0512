#include "common/metrics_http.h"

#include <sys/socket.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace ddprun::common {

// The exposition format's content type (text format 0.0.4).
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const MetricsRegistry* registry) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics port ", options.port, " is out of range; use 0..65535"));
  }
  if (!absl::StartsWith(options.path, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics path '", options.path, "' must start with '/'"));
  }
  std::unique_ptr<MetricsServer> self(new MetricsServer);
  self->server_ = std::make_unique<httplib::Server>();
  self->host_ = options.host;
  self->path_ = options.path;
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // process bind the same port and take half the scrapes. Keep SO_REUSEADDR
  // only (a restart can rebind while old connections are in TIME_WAIT).
  self->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  self->server_->Get(options.path, [registry](const httplib::Request&,
                                              httplib::Response& response) {
    response.set_content(registry->Render(), kContentType);
  });

  if (options.port == 0) {
    self->port_ = self->server_->bind_to_any_port(options.host);
  } else if (self->server_->bind_to_port(options.host, options.port)) {
    self->port_ = options.port;
  } else {
    self->port_ = -1;
  }
  if (self->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for metrics on ", options.host, ":", options.port,
        " (address in use or not local?); choose another --metrics-port or "
        "0 to let the kernel pick"));
  }
  httplib::Server* server = self->server_.get();
  self->thread_ = std::thread([server] { server->listen_after_bind(); });
  // httplib's stop() is a no-op until the accept loop has started; wait for
  // it so that Shutdown right after Start cannot leave the thread blocked.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!server->is_running()) {
    if (absl::Now() > deadline) {
      return absl::InternalError(absl::StrCat(
          "the metrics server on ", self->url(), " did not start in 10 s"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return self;
}

MetricsServer::~MetricsServer() { Shutdown(); }

std::string MetricsServer::url() const {
  std::string host =
      absl::StrContains(host_, ':') ? absl::StrCat("[", host_, "]") : host_;
  return absl::StrCat("http://", host, ":", port_, path_);
}

void MetricsServer::Shutdown() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ddprun::common
