#pragma once

#include <string>

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "relay/join_batcher.h"
#include "relay/relay_counters.h"

namespace ddprun::relay {

// Starts one downstream Rendezvous.Join: a single Join goes to `batcher`
// and its caller gets its own slot of the batch's answer; a Join that
// already carries `more` (another relay, a batching sender) passes through
// unchanged. Returns the reactor; it deletes itself when done.
grpc::ServerGenericBidiReactor* StartJoinCall(
    grpc::GenericCallbackServerContext* context, JoinBatcher* batcher,
    grpc::GenericStub* generic, const std::string& upstream,
    RelayCounters* counters);

}  // namespace ddprun::relay
