#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"

namespace ddprun::rendezvous {

// The server's check of the shared token (metadata
// `authorization: Bearer <token>`), run first by every Rendezvous and Store
// handler. The health and reflection services stay open: probes (e.g. the
// kubelet's) carry no token, and neither reveals job data.
// Immutable after construction; thread-safe.
class TokenCheck {
 public:
  // An empty token admits every call.
  explicit TokenCheck(std::string token) : token_(std::move(token)) {}

  // OK, or UNAUTHENTICATED saying what to do (never echoing a token).
  absl::Status Check(const grpc::CallbackServerContext& context) const;

 private:
  const std::string token_;
};

}  // namespace ddprun::rendezvous
