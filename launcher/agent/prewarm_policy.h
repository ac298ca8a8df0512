#pragma once

#include "absl/time/time.h"

namespace ddprun::launcher {

// When the default prewarming (a libddp program, no --prewarm) starts the
// node's zygote, counted from the moment the program says it waits for its
// round (AwaitActivation).
//
// The zygote costs about one start of the program (LibTorch loaded, the
// data read: ~0.5 CPU-s for ddprun-mnist), once per node. Where the workers
// leave a CPU free, that start runs beside them at no cost: at once. Where
// they fill every CPU this node may use, it takes from the training, even
// at SCHED_IDLE (the caches, the memory bus, and each rank's wait for its
// peer: measured, a 1-epoch world-2 ddprun-mnist lost a quarter of its
// samples/s to it on 2 cores). There the start waits, as in ski rental,
// until the job has run `amortization` times as long as the program took to
// start (the workers' own time from exec to AwaitActivation, the zygote's
// cost): a job that ends sooner never pays for a zygote, and in one that
// runs longer its cost shrinks with the job's length (a third of the time
// run until then, at most). A fault before then is recovered by a cold
// start, as with --no-prewarm. Three, not more: the wait leaves the job's
// first faults cold (bench/fault/README.md, wave 17: ten times left the
// fault harness's short jobs with cold restarts, 0.71-0.79 s a fault
// against 0.25-0.39 s prewarmed).
struct ZygoteTimingOptions {
  int nproc_per_node = 1;
  // The CPUs this node's workers may run on (sched_getaffinity); 0:
  // unknown, taken as none to spare.
  int usable_cpus = 0;
  double amortization = 3;
  absl::Duration max_delay = absl::Seconds(60);
};

// How long after AwaitActivation the zygote starts, given how long the
// workers took to get there (`program_start`).
absl::Duration ZygoteDelay(const ZygoteTimingOptions& options,
                           absl::Duration program_start);

}  // namespace ddprun::launcher
