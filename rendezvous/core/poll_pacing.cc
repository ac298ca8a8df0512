#include "rendezvous/core/poll_pacing.h"

#include <algorithm>

#include "rendezvous/core/heartbeat_scaling.h"

namespace ddprun::rendezvous {

PollPacing::PollPacing(PollPacingOptions options, const v1::JobConfig& config,
                       int64_t heartbeat_budget_per_s)
    : options_(options),
      heartbeat_interval_ms_(config.heartbeat_interval_ms()),
      heartbeat_timeout_ms_(config.heartbeat_timeout_ms()),
      heartbeat_budget_per_s_(heartbeat_budget_per_s),
      last_call_timeout_(absl::Milliseconds(config.last_call_timeout_ms())),
      max_nodes_(config.max_nodes()) {}

void PollPacing::Arrived(absl::Time now) {
  if (arrivals_++ == 0) first_arrival_ = now;
}

int64_t PollPacing::IntervalMs(int64_t polling) const {
  int64_t interval = absl::ToInt64Milliseconds(options_.min_interval);
  const int64_t budget = options_.budget_per_s;
  if (budget > 0) {
    interval = std::max(interval, (polling * 1000 + budget - 1) / budget);
  }
  return std::max<int64_t>(interval, 1);
}

absl::Duration PollPacing::Timeout(int64_t interval_ms, int64_t waiting) const {
  const int64_t timeout_ms =
      ScaleHeartbeats(heartbeat_interval_ms_, heartbeat_timeout_ms_, waiting,
                      heartbeat_budget_per_s_)
          .timeout_ms;
  return std::max(
      options_.min_timeout,
      absl::Milliseconds(interval_ms + std::max(timeout_ms, 2 * interval_ms)));
}

std::optional<absl::Time> PollPacing::ExpectedClose(
    absl::Time now, std::optional<absl::Time> min_reached_at,
    int64_t waiting) const {
  std::optional<absl::Time> close;
  if (min_reached_at.has_value()) {  // rule (c): the last call ends
    close = *min_reached_at + last_call_timeout_;
  }
  // Rule (a): the rest of max_nodes at the rate nodes came so far.
  constexpr int64_t kMinArrivals = 8;
  constexpr absl::Duration kMinSpan = absl::Milliseconds(50);
  const absl::Duration span = now - first_arrival_;
  if (arrivals_ >= kMinArrivals && span >= kMinSpan && waiting < max_nodes_) {
    const double per_s =
        static_cast<double>(arrivals_ - 1) / absl::ToDoubleSeconds(span);
    const absl::Time full =
        now + absl::Seconds(static_cast<double>(max_nodes_ - waiting) / per_s);
    close = close.has_value() ? std::min(*close, full) : full;
  }
  return close;
}

int64_t PollPacing::DelayMs(absl::Time now, std::optional<absl::Time> close,
                            int64_t polling) {
  const int64_t interval = IntervalMs(polling);
  if (!close.has_value()) return interval;
  if (!told_close_.has_value()) told_close_ = close;
  // The k-th waiting answer's place in one interval after the close (a
  // node answered `waiting` again takes a new place).
  const int64_t spread = std::max<int64_t>(1, polling);
  const absl::Duration place = absl::Milliseconds(interval) *
                               (static_cast<double>(places_given_++ % spread) /
                                static_cast<double>(spread));
  const absl::Duration delay =
      std::clamp(*close + place - now, options_.min_interval,
                 std::max(options_.min_interval, options_.max_delay));
  return std::max<int64_t>(
      1, absl::ToInt64Milliseconds(absl::Ceil(delay, absl::Milliseconds(1))));
}

std::optional<absl::Time> PollPacing::TakeToldClose() {
  std::optional<absl::Time> told = told_close_;
  told_close_.reset();
  return told;
}

}  // namespace ddprun::rendezvous
