#include "launcher/agent/rendezvous_api.h"

#include "absl/strings/cord.h"

namespace ddprun::launcher {
namespace {

constexpr char kJoinLeft[] = "ddprun.launcher/join-left";

}  // namespace

absl::Status JoinLeftError() {
  absl::Status status = absl::CancelledError(
      "Join left: the agent's check said its node has nothing left to join "
      "for");
  status.SetPayload(kJoinLeft, absl::Cord("1"));
  return status;
}

bool IsJoinLeft(const absl::Status& status) {
  return status.code() == absl::StatusCode::kCancelled &&
         status.GetPayload(kJoinLeft).has_value();
}

absl::StatusOr<v1::JoinResponse> RendezvousApi::JoinUnless(
    const v1::JoinRequest& request, absl::Duration join_timeout,
    absl::Duration unreachable_timeout, absl::FunctionRef<bool()> leave) {
  if (leave()) return JoinLeftError();
  return Join(request, join_timeout, unreachable_timeout);
}

}  // namespace ddprun::launcher
