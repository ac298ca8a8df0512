#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ddprun::common {

// gRPC and absl share their code numbers; these keep the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ddprun::common
