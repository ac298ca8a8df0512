#include "common/endpoint.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddprun::common {

std::string Endpoint::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text,
                                       int default_port) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad endpoint '%s': %s; write HOST:PORT, e.g. 127.0.0.1:29400 or "
        "[::1]:29400",
        text, why));
  };
  if (text.empty()) return bad("it is empty");
  Endpoint ep;
  absl::string_view port_text;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) return bad("no closing ']'");
    ep.host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("expected ':' after ']'");
      port_text = rest.substr(1);
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != absl::string_view::npos && text.find(':') != colon) {
      return bad("an IPv6 address needs brackets");
    }
    if (colon == absl::string_view::npos) {
      ep.host = std::string(text);
    } else {
      ep.host = std::string(text.substr(0, colon));
      port_text = text.substr(colon + 1);
      if (port_text.empty()) return bad("the port is empty");
    }
  }
  if (ep.host.empty()) return bad("the host is empty");
  if (port_text.empty()) {
    if (default_port <= 0) return bad("no port");
    ep.port = default_port;
    return ep;
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return bad(absl::StrCat("port '", port_text, "' is not in 0..65535"));
  }
  ep.port = port;
  return ep;
}

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

}  // namespace ddprun::common
