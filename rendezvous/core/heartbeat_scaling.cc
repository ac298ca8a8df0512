#include "rendezvous/core/heartbeat_scaling.h"

#include <algorithm>
#include <cmath>

namespace ddprun::rendezvous {

HeartbeatTiming ScaleHeartbeats(int64_t interval_ms, int64_t timeout_ms,
                                int64_t nodes, int64_t budget_per_s) {
  HeartbeatTiming timing{.interval_ms = interval_ms, .timeout_ms = timeout_ms};
  if (budget_per_s <= 0 || interval_ms <= 0) return timing;
  // n / interval <= budget, in whole milliseconds rounded up.
  const int64_t needed_ms = (nodes * 1000 + budget_per_s - 1) / budget_per_s;
  if (needed_ms <= interval_ms) return timing;
  timing.interval_ms = needed_ms;
  timing.timeout_ms = static_cast<int64_t>(std::ceil(
      static_cast<double>(timeout_ms) * static_cast<double>(needed_ms) /
      static_cast<double>(interval_ms)));
  return timing;
}

int64_t ScaleFiguresInterval(int64_t interval_ms, int64_t nodes,
                             int64_t budget_per_s) {
  if (budget_per_s <= 0 || interval_ms <= 0) return interval_ms;
  const int64_t needed_ms = (nodes * 1000 + budget_per_s - 1) / budget_per_s;
  return std::max(interval_ms, needed_ms);
}

}  // namespace ddprun::rendezvous
