#pragma once

namespace ddprun::worker {

// A process-wide request to abandon the collective in flight: set by the
// in-place recovery watcher (worker/recovery.h) when the agent announces a
// new round, checked by the waits of libddp's own collectives (the
// shared-memory allreduce), which then fail with an Aborted error instead
// of waiting for a peer that is gone or stopped. Thread-safe.
void RequestCollectiveAbort();
void ClearCollectiveAbort();
bool CollectiveAbortRequested();

}  // namespace ddprun::worker
