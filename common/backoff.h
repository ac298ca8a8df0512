#pragma once

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace ddprun::common {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(20);
  absl::Duration max = absl::Seconds(2);
  double multiplier = 2.0;
  double jitter = 0.2;  // each delay is scaled by a factor in [1-j, 1+j]
};

// Capped exponential backoff with jitter: the one retry pacing of ddprun.
// Not thread-safe; one per retry loop.
class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {});
  // The delay before the next attempt; grows after each call.
  absl::Duration Next();
  void Reset();

 private:
  BackoffOptions options_;
  absl::Duration current_;
  absl::BitGen rng_;
};

}  // namespace ddprun::common
