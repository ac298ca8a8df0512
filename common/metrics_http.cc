#include "common/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ddprun::common {
namespace {

// The exposition format's content type (text format 0.0.4).
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A scrape's request is a line and a few headers; anything larger is not one.
constexpr size_t kMaxRequestBytes = 16 * 1024;
// A client that sends nothing (or reads nothing) for this long is dropped, so
// it cannot hold up the next scrape for longer.
constexpr int kClientTimeoutS = 5;

bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, bool with_body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n",
                      with_body ? body : absl::string_view());
}

// Reads one request's head from `fd` and answers it: GET or HEAD of `path`
// is the registry, of another path what `pages` gives for it, else 404; any
// other method 405.
void Answer(
    int fd, const std::string& path, const MetricsRegistry& registry,
    const std::function<std::optional<HttpPage>(const std::string&)>& pages) {
  timeval timeout{kClientTimeoutS, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string head;
  char buffer[4096];
  while (!absl::StrContains(head, "\r\n\r\n")) {
    if (head.size() > kMaxRequestBytes) return;
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, timed out or failed: nothing to answer
    head.append(buffer, static_cast<size_t>(n));
  }
  std::vector<absl::string_view> request_line =
      absl::StrSplit(absl::string_view(head).substr(0, head.find("\r\n")), ' ');
  if (request_line.size() != 3) {
    WriteAll(fd,
             Response("400 Bad Request", "text/plain", "bad request\n", true));
    return;
  }
  absl::string_view method = request_line[0];
  absl::string_view target = request_line[1];
  target = target.substr(0, target.find('?'));
  if (target != path && pages && (method == "GET" || method == "HEAD")) {
    std::optional<HttpPage> page = pages(std::string(target));
    WriteAll(fd, page.has_value() ? Response("200 OK", page->content_type,
                                             page->body, method == "GET")
                                  : Response("404 Not Found", "text/plain",
                                             "not found\n", true));
  } else if (target != path) {
    WriteAll(fd, Response("404 Not Found", "text/plain", "not found\n", true));
  } else if (method != "GET" && method != "HEAD") {
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain", "use GET\n",
                          true));
  } else {
    WriteAll(fd, Response("200 OK", kContentType, registry.Render(),
                          method == "GET"));
  }
}

}  // namespace

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
  self->registry_ = registry;
  self->host_ = options.host;
  self->path_ = options.path;
  self->pages_ = options.pages;
  self->port_ = options.port;
  auto unavailable = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for metrics on ", options.host, ":", options.port, ": ",
        why,
        " (address in use or not local?); choose another --metrics-port "
        "or 0 to let the kernel pick"));
  };

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  std::string port = absl::StrCat(options.port);
  if (int rc =
          getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(),
                      port.c_str(), &hints, &addresses);
      rc != 0) {
    return unavailable(gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = strerror(errno);
      continue;
    }
    // SO_REUSEADDR only: a restart can rebind while old connections are in
    // TIME_WAIT. Never SO_REUSEPORT, which would let a second process bind
    // the same port and take half the scrapes.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      self->listen_fd_.Reset(fd);
      break;
    }
    error = strerror(errno);
    close(fd);
  }
  freeaddrinfo(addresses);
  if (!self->listen_fd_.valid()) return unavailable(error);

  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(self->listen_fd_.get(), reinterpret_cast<sockaddr*>(&bound),
                  &length) != 0) {
    return unavailable(strerror(errno));
  }
  self->port_ = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  absl::StatusOr<PipeEnds> wake = MakePipe(O_CLOEXEC);
  if (!wake.ok()) {
    return absl::InternalError(
        absl::StrCat("the metrics server: ", wake.status().message()));
  }
  self->wake_ = std::move(*wake);
  MetricsServer* server = self.get();
  self->thread_ = std::thread([server] { server->Serve(); });
  return self;
}

void MetricsServer::Serve() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                   {wake_.read.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // Shutdown
    if ((fds[0].revents & POLLIN) == 0) continue;
    int client = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    Answer(client, path_, *registry_, pages_);
    close(client);
  }
}

MetricsServer::~MetricsServer() { Shutdown(); }

std::string MetricsServer::url() const {
  std::string host =
      absl::StrContains(host_, ':') ? absl::StrCat("[", host_, "]") : host_;
  return absl::StrCat("http://", host, ":", port_, path_);
}

void MetricsServer::Shutdown() {
  if (thread_.joinable()) {
    char wake = 0;
    while (write(wake_.write.get(), &wake, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  listen_fd_.Reset();
  wake_ = {};
}

}  // namespace ddprun::common
