#pragma once

#include <functional>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddprun::testing {

// Polls `condition` until it holds or `timeout` passes; returns whether it
// held. The poll period is short and is not what a test asserts on.
inline bool WaitFor(const std::function<bool()>& condition,
                    absl::Duration timeout,
                    absl::Duration poll = absl::Milliseconds(5)) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(poll);
  }
}

}  // namespace ddprun::testing
