#include "rendezvous/core/memory_return.h"

#include <algorithm>
#include <iterator>

namespace ddprun::rendezvous {

bool MemoryReturn::Tick(absl::Time now, const FanOutState& state) {
  if (options_.large_fan_out == 0) return false;
  peak_ = std::max(peak_, state.peak_parked);
  if (!fan_out_at_.has_value()) {
    // A fan-out: a large number parked, and most of them answered now.
    if (peak_ < options_.large_fan_out || state.parked > peak_ / 2) {
      return false;
    }
    fan_out_at_ = now;
    first_trim_at_.reset();
    trims_ = 0;
    window_start_ = now;
    window_calls_ = state.join_calls;
    return false;
  }
  if (!first_trim_at_.has_value()) {
    bool quiet = false;
    if (now - window_start_ >= options_.quiet_window) {
      const int64_t calls = state.join_calls - window_calls_;
      quiet = calls < static_cast<int64_t>(options_.large_fan_out / 10);
      window_start_ = now;
      window_calls_ = state.join_calls;
    }
    const bool over = quiet && state.answers_for_poll == 0;
    if (!over && now - *fan_out_at_ < options_.max_wait) return false;
    first_trim_at_ = now;
    trims_ = 1;
    return true;
  }
  // Later trims: the answered calls free their memory only when gRPC is
  // done sending them.
  static constexpr absl::Duration kAfterFirst[] = {absl::Seconds(4),
                                                   absl::Seconds(19)};
  if (now - *first_trim_at_ < kAfterFirst[trims_ - 1]) return false;
  if (++trims_ > static_cast<int>(std::size(kAfterFirst))) {
    // The last one: a later fan-out is measured from the calls parked now.
    peak_ = state.parked;
    fan_out_at_.reset();
  }
  return true;
}

}  // namespace ddprun::rendezvous
