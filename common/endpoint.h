#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::common {

// A host and port as users write them: "host:port", "1.2.3.4:port" or
// "[::1]:port". The host keeps no brackets.
struct Endpoint {
  std::string host;
  int port = 0;

  // "host:port", with brackets around an IPv6 host; what gRPC dials.
  std::string ToString() const;
};

// Parses "host:port". When the port is missing, default_port is used if it is
// positive, otherwise it is an error.
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text,
                                       int default_port = -1);

// Whether `host` lets only this machine connect (127.0.0.0/8, ::1,
// localhost): the servers' rule for listening without authentication.
bool IsLoopbackHost(absl::string_view host);

}  // namespace ddprun::common
