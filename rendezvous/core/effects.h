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

// A round closed: its Joins are among `joins`. Once every one of those
// calls is done (its answer sent) the adapter calls
// JobTable::AnswersDelivered, which starts the round's heartbeat clocks then
// (handing out 100,000 answers takes seconds, and no member can beat before
// it has its answer).
struct ClosedRound {
  std::string run_id;
  int64_t round = 0;
};

// What a decision of the job state machine asks the adapters to do. The
// state classes fill it under their lock; the adapters apply it after the
// lock is released, so that no gRPC call happens under a state lock.
struct Effects {
  std::vector<JoinCompletion> joins;
  std::vector<ReleasedRounds> released;
  std::vector<ClosedRound> closed;

  bool empty() const {
    return joins.empty() && released.empty() && closed.empty();
  }
};

}  // namespace ddprun::rendezvous
