#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "worker/collectives.h"

namespace ddprun::worker {

// Forms a process group with `form` (a c10d backend's constructor, e.g.
// ProcessGroupGloo's: it exchanges addresses through the store, then
// connects to every peer, and nothing interrupts it before its own timeout)
// on a thread of its own, and waits for it or for the end of the round,
// whichever comes first. The round ends when the agent sends the next one
// (worker/recovery.h), which requests a collective abort
// (worker/collective_abort.h): then this returns ABORTED at once, and the
// formation goes on alone until it completes or times out and drops what
// it formed. Without this, a survivor whose peer was stopped and then
// killed while their group formed waited in Gloo's connect for the group's
// whole timeout with its next round unread, and its agent found it hung
// only after the join phase's bound (30 s and more).
//
// An exception from `form` comes back as UNAVAILABLE with its message.
// `form` must own what it uses (copies, not references to the caller's
// locals): an abandoned formation outlives the call.
absl::StatusOr<c10::intrusive_ptr<Collectives>> FormAbortably(
    std::function<c10::intrusive_ptr<Collectives>()> form);

// Abandoned formations that still run.
int AbandonedFormations();

}  // namespace ddprun::worker
