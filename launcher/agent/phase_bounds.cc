#include "launcher/agent/phase_bounds.h"

#include <algorithm>

namespace ddprun::launcher {

namespace {

// The phases whose blocked and spin bounds are learned by rank
// (BlockedBound, SpinBound).
bool LearnedByRank(common::Phase phase) {
  return phase == common::Phase::kEval || phase == common::Phase::kCheckpoint;
}

}  // namespace

PhaseBounds::PhaseBounds(PhaseBoundsOptions options) : options_(options) {}

void PhaseBounds::Observe(common::Phase phase, absl::Duration duration,
                          int rank) {
  absl::Duration& longest = longest_[static_cast<int>(phase)];
  longest = std::max(longest, duration);
  ++seen_[static_cast<int>(phase)];
  if (rank >= 0 && LearnedByRank(phase)) {
    absl::Duration& own = rank_longest_[{rank, phase}];
    own = std::max(own, duration);
  }
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

absl::Duration PhaseBounds::BlockedBound(common::Phase phase, int rank) const {
  if (options_.blocked_fixed.has_value()) return *options_.blocked_fixed;
  if (LearnedByRank(phase)) {
    auto own = rank_longest_.find({rank, phase});
    if (own == rank_longest_.end()) {
      return std::max(options_.blocked_unseen_floor,
                      longest_[static_cast<int>(phase)] * options_.factor);
    }
    return std::max(options_.blocked_floor, own->second * options_.factor);
  }
  return std::max(options_.blocked_floor,
                  longest_step_compute_ * options_.factor);
}

absl::Duration PhaseBounds::QuietBound(common::Phase phase, int rank) const {
  if (options_.blocked_fixed.has_value()) return absl::InfiniteDuration();
  if (!LearnedByRank(phase)) {
    return std::max(options_.quiet_floor,
                    longest_step_compute_ * options_.factor);
  }
  auto own = rank_longest_.find({rank, phase});
  if (own != rank_longest_.end()) {
    return std::max(options_.quiet_floor, own->second * options_.factor);
  }
  if (found_quiet_.count({rank, phase}) > 0) return absl::InfiniteDuration();
  return std::max(options_.quiet_floor,
                  longest_[static_cast<int>(phase)] * options_.factor);
}

bool PhaseBounds::FirstTimeThere(common::Phase phase, int rank) const {
  return LearnedByRank(phase) && rank_longest_.count({rank, phase}) == 0;
}

void PhaseBounds::ObserveFoundQuiet(common::Phase phase, int rank) {
  found_quiet_.insert({rank, phase});
}

void PhaseBounds::ObserveStepCpu(absl::Duration cpu) {
  longest_step_cpu_ = std::max(longest_step_cpu_, cpu);
}

void PhaseBounds::ObserveStepCompute(absl::Duration compute) {
  longest_step_compute_ = std::max(longest_step_compute_, compute);
}

void PhaseBounds::ObservePhaseCpu(common::Phase phase, absl::Duration cpu,
                                  int rank) {
  if (rank < 0 || !LearnedByRank(phase)) return;
  absl::Duration& most = rank_most_cpu_[{rank, phase}];
  most = std::max(most, cpu);
}

absl::Duration PhaseBounds::SpinBound() const {
  if (options_.spin_fixed.has_value()) return *options_.spin_fixed;
  return std::max(options_.spin_floor, longest_step_cpu_ * options_.factor);
}

absl::Duration PhaseBounds::SpinBound(common::Phase phase, int rank) const {
  if (!LearnedByRank(phase)) return SpinBound();
  if (options_.spin_fixed.has_value()) return *options_.spin_fixed;
  auto own = rank_most_cpu_.find({rank, phase});
  if (own == rank_most_cpu_.end()) return absl::InfiniteDuration();
  return std::max(options_.spin_floor, own->second * options_.factor);
}

}  // namespace ddprun::launcher
