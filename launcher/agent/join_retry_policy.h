#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/backoff.h"

namespace ddprun::launcher {

struct JoinRetryPolicyOptions {
  // How long a server that cannot be reached (UNAVAILABLE) is retried, from
  // the Join's start or from the server's last `waiting` answer.
  absl::Duration unreachable_timeout = absl::Seconds(60);
  // The pacing of those retries (ddprun's one backoff; tests set jitter 0).
  common::BackoffOptions backoff;
};

// Decides what a Join does after each answer, apart from the calls and the
// waits (RendezvousClient::Join makes them): poll again when the server
// says the round is not decided yet, retry a server that cannot be reached
// with capped exponential backoff until the unreachable timeout, and return
// anything else. Every method takes `now` (the caller's clock), so that
// tests step time by hand. Not thread-safe: one per Join.
class JoinRetryPolicy {
 public:
  enum class Action {
    kReturn,     // the answer (or error) is the Join's result
    kPollAgain,  // send the same Join after `wait` (the server's interval)
    kRetry,      // send it again after `wait` (backoff): the server was down
  };
  struct Step {
    Action action = Action::kReturn;
    absl::Duration wait = absl::ZeroDuration();
  };

  JoinRetryPolicy(JoinRetryPolicyOptions options, absl::Time now);

  // How long a Join retries an unreachable server: --rdzv-conf
  // read_timeout, but never longer than the Join itself may wait.
  static absl::Duration UnreachableTimeout(absl::Duration join_timeout,
                                           absl::Duration read_timeout);
  // How long the client waits for the answer to one Join parked on the
  // server: a little past the server's own join_timeout, so that the
  // server's answer, not the client's timer, says what happened.
  static absl::Duration AnswerBound(absl::Duration join_timeout);

  // The server answered `waiting`: the round is not decided yet. Polls
  // again after the interval it says (at least 1 ms); the unreachable
  // timeout and the backoff start over, as the server was just heard.
  Step OnWaiting(int64_t poll_interval_ms, absl::Time now);
  // The Join failed with `code`. Only UNAVAILABLE is retried, while the
  // unreachable timeout lasts; the last wait ends at that bound.
  Step OnFailed(absl::StatusCode code, absl::Time now);

  // When retrying an unreachable server stops.
  absl::Time give_up() const { return give_up_; }

 private:
  JoinRetryPolicyOptions options_;
  absl::Time give_up_;
  common::Backoff backoff_;
};

}  // namespace ddprun::launcher
