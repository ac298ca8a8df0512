#include "common/backoff.h"

#include <algorithm>

namespace ddprun::common {

Backoff::Backoff(BackoffOptions options)
    : options_(options), current_(options.initial) {}

absl::Duration Backoff::Next() {
  double factor =
      absl::Uniform(rng_, 1.0 - options_.jitter, 1.0 + options_.jitter);
  absl::Duration delay = current_ * factor;
  current_ = std::min(current_ * options_.multiplier, options_.max);
  return delay;
}

void Backoff::Reset() { current_ = options_.initial; }

}  // namespace ddprun::common
