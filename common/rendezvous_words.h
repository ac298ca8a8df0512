#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::common {

// The rendezvous enums as the words people read (logs, `ddprun status`,
// metrics labels) and as the pre-enum string fields carried them:
// FAILURE_CAUSE_HUNG <-> "hung", NODE_STATE_REJOINING <-> "rejoining". The
// words come from the enum value names (protobuf reflection), so a new value
// needs no code here. Thread-safe (pure functions).

std::string FailureCauseWord(v1::FailureCause cause);
// FAILURE_CAUSE_UNSPECIFIED for an unknown word.
v1::FailureCause FailureCauseFromWord(absl::string_view word);
std::string NodeStateWord(v1::NodeState state);

// Fills whichever of failure_cause and the older `cause` word is missing
// from the other, so that readers of either see the cause (a record from an
// agent older than the enum carries only the word).
void NormalizeFailureCause(v1::WorkerFailure& failure);

}  // namespace ddprun::common
