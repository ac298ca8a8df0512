#pragma once

// Prometheus metrics for every call a gRPC server handles, as a server
// interceptor: calls started, calls finished by status code, and handling
// latency, labelled by service and method. Latency runs from the call's
// arrival to its status, so a parked call (a rendezvous Join, a store Wait)
// counts its whole wait.
//
//   common::MetricsRegistry registry;
//   grpc::ServerBuilder builder;
//   builder.experimental().SetInterceptorCreators(
//       common::GrpcServerMetricsInterceptors(&registry));
//
// Families (service "ddprun.v1.Store", method "Get", code "OK", ...):
//   ddprun_grpc_server_started_total{service,method}
//   ddprun_grpc_server_handled_total{service,method,code}
//   ddprun_grpc_server_handling_seconds{service,method}   (histogram)

#include <memory>
#include <vector>

#include "common/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace ddprun::common {

// The interceptor factories to hand to ServerBuilder. `registry` must outlive
// the server. Thread-safe, like the registry.
std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
GrpcServerMetricsInterceptors(MetricsRegistry* registry);

// "OK", "DEADLINE_EXCEEDED", ... as gRPC spells its codes.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace ddprun::common
