#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace ddprun::relay {

// The request metadata the rendezvous server checks: `authorization` and
// every `ddprun-*` key, in the caller's order.
using ForwardedMetadata = std::vector<std::pair<std::string, std::string>>;

ForwardedMetadata MetadataToForward(const grpc::ServerContextBase& context);

// Adds `metadata` to an upstream call.
void AttachMetadata(const ForwardedMetadata& metadata,
                    grpc::ClientContext* upstream);

// The caller's deadline on the upstream call (none stays none).
void ForwardDeadline(const grpc::ServerContextBase& context,
                     grpc::ClientContext* upstream);

// Whether the caller set a deadline.
bool HasDeadline(std::chrono::system_clock::time_point deadline);

// What a caller gets for an upstream status: the same code and message,
// except UNAVAILABLE, whose message says that the relay could not reach
// `upstream` (the caller dialled the relay and would not know).
grpc::Status FromUpstream(const grpc::Status& status,
                          const std::string& upstream);

// Calls that may share one upstream message: same job, same forwarded
// metadata (the server checks the token once per message).
std::string GroupKey(const std::string& run_id,
                     const ForwardedMetadata& metadata);

}  // namespace ddprun::relay
