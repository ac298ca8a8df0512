#pragma once

#include "grpcpp/generic/async_generic_service.h"
#include "relay/heartbeat_mux.h"
#include "relay/relay_counters.h"

namespace ddprun::relay {

// Starts one downstream Rendezvous.Heartbeats stream (`streaming`) or unary
// Heartbeat: each message goes to `mux`, each answer back in order. A
// stream ends OK once its caller closed its side and every beat was
// answered, or with the upstream's error. Returns the reactor; it deletes
// itself when done.
grpc::ServerGenericBidiReactor* StartBeatCall(
    grpc::GenericCallbackServerContext* context, HeartbeatMux* mux,
    bool streaming, RelayCounters* counters);

}  // namespace ddprun::relay
