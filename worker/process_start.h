#pragma once

#include <string>
#include <vector>

namespace ddprun::worker {

// Seconds since this process was created (exec'd, or forked by the
// standbys' zygote: worker/standby.h), from /proc/self/stat's starttime
// against CLOCK_BOOTTIME: what "launch to first step" counts, including
// the ~1 s of loading LibTorch's shared libraries before main (none for a
// forked standby, which has them from the zygote).
// Resolution: one clock tick (10 ms). -1 when /proc is unavailable.
double SecondsSinceProcessStart();

}  // namespace ddprun::worker
