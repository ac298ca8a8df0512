#include "launcher/agent/prewarm_policy.h"

#include <algorithm>

namespace ddprun::launcher {

absl::Duration ZygoteDelay(const ZygoteTimingOptions& options,
                           absl::Duration program_start) {
  if (options.usable_cpus > options.nproc_per_node) return absl::ZeroDuration();
  const absl::Duration amortized =
      std::max(program_start, absl::ZeroDuration()) * options.amortization;
  return std::min(amortized, options.max_delay);
}

}  // namespace ddprun::launcher
