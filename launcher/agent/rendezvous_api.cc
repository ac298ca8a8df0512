#include "launcher/agent/rendezvous_api.h"

#include "absl/strings/cord.h"

namespace ddprun::launcher {
namespace {

constexpr char kJoinInterrupted[] = "ddprun.launcher/join-interrupted";

}  // namespace

absl::Status JoinInterruptedError() {
  absl::Status status = absl::CancelledError(
      "Join interrupted: a child of the agent changed state");
  status.SetPayload(kJoinInterrupted, absl::Cord("1"));
  return status;
}

bool IsJoinInterrupted(const absl::Status& status) {
  return status.code() == absl::StatusCode::kCancelled &&
         status.GetPayload(kJoinInterrupted).has_value();
}

}  // namespace ddprun::launcher
