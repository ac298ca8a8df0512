#include "rendezvous/token_check.h"

#include "common/credentials.h"

namespace ddprun::rendezvous {

absl::Status TokenCheck::Check(
    const grpc::CallbackServerContext& context) const {
  if (common::CallHasToken(context.client_metadata(), token_)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "the call carries no valid token: this server requires the shared "
      "token as 'authorization: Bearer <token>'; give the agent the same "
      "--token-file (or DDPRUN_TOKEN) as the server");
}

}  // namespace ddprun::rendezvous
