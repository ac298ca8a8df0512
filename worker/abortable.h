#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "worker/collectives.h"

namespace ddprun::worker {

// Waits that the end of a round ends. The round ends when the agent sends
// the next one (worker/recovery.h), which requests a collective abort
// (worker/collective_abort.h); c10d itself cannot interrupt a group's
// formation or a Gloo operation before the group's timeout (5 minutes).

// Forms a process group with `form` (a c10d backend's constructor, e.g.
// ProcessGroupGloo's: it exchanges addresses through the store, then
// connects to every peer) on a thread of its own, and waits for it or for
// the end of the round, whichever comes first: then this returns ABORTED
// at once, and the formation goes on alone until it completes or times out
// and drops what it formed. Without this, a survivor whose peer was stopped
// and then killed while their group formed waited in Gloo's connect with
// its next round unread, until its agent found it hung after the join
// phase's bound (30 s and more).
//
// An exception from `form` comes back as UNAVAILABLE with its message.
// `form` must own what it uses (copies, not references to the caller's
// locals): an abandoned formation outlives the call.
absl::StatusOr<c10::intrusive_ptr<Collectives>> FormAbortably(
    std::function<c10::intrusive_ptr<Collectives>()> form);

// Abandoned formations that still run.
int AbandonedFormations();

// Waits for `work` (a collective of a Gloo group), or until the round ends:
// then returns false and the work goes on. Rethrows the work's own error.
// A caller that gets false must keep the group, and every buffer the work
// reads or writes, alive until the work completes (it may still write
// them); destroying the group would wait for it. Gloo fails a collective
// whose peer's process is gone (a test shows it), yet the soak saw a node
// leader wait a minute in a pending send of the leaders' allreduce, its
// peer leader killed or in the next round, its own next round unread.
bool WaitUnlessAborted(const c10::intrusive_ptr<::c10d::Work>& work);

// WaitUnlessAborted for a collective of `group` whose tensors the work
// holds: when the round ends first, a thread of its own keeps `group` and
// the work until it completes (so that dropping the caller's group does
// not wait for it) and this throws, as a failed collective does.
void WaitOrAbandon(const c10::intrusive_ptr<Collectives>& group,
                   const c10::intrusive_ptr<::c10d::Work>& work);

}  // namespace ddprun::worker
