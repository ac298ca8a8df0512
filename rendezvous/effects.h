#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

// Names one parked call (a Join, a store Get or Wait). The gRPC adapters
// allocate ids and keep the reactor under it; the state classes only keep the
// id, so they know nothing about gRPC.
using WaiterId = uint64_t;

// A parked Join the adapter must now answer.
struct JoinCompletion {
  WaiterId waiter = 0;
  absl::StatusOr<v1::JoinResponse> response;
};

// A job moved past its round: the store scopes (run_id, r) with
// r < before_round are over and must be released.
struct ReleasedRounds {
  std::string run_id;
  int64_t before_round = 0;
};

// What a decision of the job state machine asks the adapters to do. The
// state classes fill it under their lock; the adapters apply it after the
// lock is released, so that no gRPC call happens under a state lock.
struct Effects {
  std::vector<JoinCompletion> joins;
  std::vector<ReleasedRounds> released;

  bool empty() const { return joins.empty() && released.empty(); }
};

}  // namespace ddprun::rendezvous
