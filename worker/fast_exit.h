#pragma once

namespace ddprun::worker {

// Ends the process with `code` once its output is flushed, without running
// static destructors. LibTorch's deregister its ~2,000 operators one by one:
// ~65 ms of CPU at every worker's exit, paid N times per node at the end of
// a job and at every restart. Call it only where nothing else is left to
// clean up (files closed, process group destroyed).
[[noreturn]] void ExitWithoutTeardown(int code);

}  // namespace ddprun::worker
