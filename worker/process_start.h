#pragma once

namespace ddprun::worker {

// Seconds since this process was created (exec'd), from /proc/self/stat's
// starttime against CLOCK_BOOTTIME: what "launch to first step" counts,
// including the ~1 s of loading LibTorch's shared libraries before main.
// Resolution: one clock tick (10 ms). -1 when /proc is unavailable.
double SecondsSinceProcessStart();

}  // namespace ddprun::worker
