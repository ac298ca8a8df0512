#pragma once

#include <string>

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "relay/relay_counters.h"

namespace ddprun::relay {

// Starts passing one downstream call (any method, unary or streaming) to the
// upstream server unchanged: the same method, messages as bytes in both
// directions, the forwarded metadata and the caller's deadline; the
// upstream status and message come back as they are (UNAVAILABLE says the
// relay could not reach `upstream`). A caller that goes away cancels the
// upstream call. Returns the reactor; it deletes itself once both sides are
// done. `stub` must outlive the call.
grpc::ServerGenericBidiReactor* StartPassthrough(
    grpc::GenericCallbackServerContext* context, grpc::GenericStub* stub,
    const std::string& upstream, RelayCounters* counters);

}  // namespace ddprun::relay
