#include "relay/join_fanout.h"

#include "relay/forwarding.h"

namespace ddprun::relay {
namespace {

JoinOutcome FromSlot(const v1::JoinResponse& slot) {
  JoinOutcome outcome;
  if (slot.has_error()) {
    outcome.status =
        grpc::Status(static_cast<grpc::StatusCode>(slot.error().code()),
                     slot.error().message());
    return outcome;
  }
  outcome.response = slot;
  outcome.response.clear_more();
  return outcome;
}

}  // namespace

std::vector<JoinOutcome> SplitJoinAnswer(const grpc::Status& status,
                                         const v1::JoinResponse& response,
                                         int nodes,
                                         const std::string& upstream) {
  std::vector<JoinOutcome> outcomes;
  if (!status.ok()) {
    outcomes.assign(nodes, JoinOutcome{FromUpstream(status, upstream), {}});
    return outcomes;
  }
  if (nodes == 1) {
    outcomes.push_back(JoinOutcome{grpc::Status::OK, response});
    return outcomes;
  }
  outcomes.push_back(FromSlot(response));
  if (response.more_size() != nodes - 1) return outcomes;  // an old server
  for (const v1::JoinResponse& slot : response.more()) {
    outcomes.push_back(FromSlot(slot));
  }
  return outcomes;
}

}  // namespace ddprun::relay
