#pragma once

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace ddprun::testing {

// A client context for a test's call: a deadline far beyond the test's own
// bounded waits (a call never outlives a failing test), and `token`, if
// any, as the bearer credential the server checks.
inline std::unique_ptr<grpc::ClientContext> BoundedContext(
    const std::string& token = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return context;
}

}  // namespace ddprun::testing
