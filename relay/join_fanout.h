#pragma once

#include <string>
#include <vector>

#include "ddprun/v1/rendezvous.pb.h"
#include "grpcpp/support/status.h"

namespace ddprun::relay {

// What one caller of a batched Join gets.
struct JoinOutcome {
  grpc::Status status;        // the call's status
  v1::JoinResponse response;  // its answer when status is OK
};

// How the answer to an upstream Join of `nodes` nodes (the request's own
// node and nodes - 1 in `more`) splits over its callers, in order:
// - the call failed: every caller gets its status (FromUpstream);
// - one node: the answer or the status as is;
// - a batched answer: slot 0 is the answer without `more`, slot i is
//   more[i - 1]; a slot holding `error` ends its caller with that code and
//   message;
// - an answer without `more` to a batch (a server older than batches
//   joined only the first node): only slot 0 is returned; the caller
//   sends the others again, one by one.
std::vector<JoinOutcome> SplitJoinAnswer(const grpc::Status& status,
                                         const v1::JoinResponse& response,
                                         int nodes,
                                         const std::string& upstream);

}  // namespace ddprun::relay
