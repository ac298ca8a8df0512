#include "launcher/agent/join_retry_policy.h"

#include <algorithm>

namespace ddprun::launcher {

JoinRetryPolicy::JoinRetryPolicy(JoinRetryPolicyOptions options, absl::Time now)
    : options_(options),
      give_up_(now + options.unreachable_timeout),
      backoff_(options.backoff) {}

absl::Duration JoinRetryPolicy::UnreachableTimeout(
    absl::Duration join_timeout, absl::Duration read_timeout) {
  return std::min(join_timeout, read_timeout);
}

absl::Duration JoinRetryPolicy::AnswerBound(absl::Duration join_timeout) {
  return join_timeout + absl::Seconds(5);
}

JoinRetryPolicy::Step JoinRetryPolicy::OnWaiting(int64_t poll_interval_ms,
                                                 absl::Time now) {
  give_up_ = now + options_.unreachable_timeout;
  backoff_.Reset();
  return {Action::kPollAgain,
          absl::Milliseconds(std::max<int64_t>(1, poll_interval_ms))};
}

JoinRetryPolicy::Step JoinRetryPolicy::OnFailed(absl::StatusCode code,
                                                absl::Time now) {
  if (code != absl::StatusCode::kUnavailable || now >= give_up_) {
    return {Action::kReturn};
  }
  return {Action::kRetry, std::min(backoff_.Next(), give_up_ - now)};
}

}  // namespace ddprun::launcher
