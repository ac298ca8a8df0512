#include "launcher/agent/phase_bounds.h"

#include <algorithm>

namespace ddprun::launcher {

PhaseBounds::PhaseBounds(PhaseBoundsOptions options) : options_(options) {}

void PhaseBounds::Observe(common::Phase phase, absl::Duration duration) {
  absl::Duration& longest = longest_[static_cast<int>(phase)];
  longest = std::max(longest, duration);
  ++seen_[static_cast<int>(phase)];
}

absl::Duration PhaseBounds::Bound(common::Phase phase) const {
  const int i = static_cast<int>(phase);
  if (options_.fixed[i].has_value()) return *options_.fixed[i];
  const absl::Duration floor = seen_[i] >= options_.learn_after
                                   ? options_.learned_floor[i]
                                   : options_.floor[i];
  absl::Duration longest = longest_[i];
  if (phase == common::Phase::kStep && seen_[i] < options_.learn_after) {
    longest = std::max(longest,
                       longest_[static_cast<int>(common::Phase::kFirstStep)]);
  }
  return std::max(floor, longest * options_.factor);
}

absl::Duration PhaseBounds::BlockedBound() const {
  if (options_.blocked_fixed.has_value()) return *options_.blocked_fixed;
  return std::max(
      options_.blocked_floor,
      longest_[static_cast<int>(common::Phase::kStep)] * options_.factor);
}

void PhaseBounds::ObserveStepCpu(absl::Duration cpu) {
  longest_step_cpu_ = std::max(longest_step_cpu_, cpu);
}

absl::Duration PhaseBounds::SpinBound() const {
  if (options_.spin_fixed.has_value()) return *options_.spin_fixed;
  return std::max(options_.spin_floor, longest_step_cpu_ * options_.factor);
}

}  // namespace ddprun::launcher
