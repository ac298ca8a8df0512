#pragma once

#include <sys/types.h>

#include "launcher/posix/control_channel.h"
#include "launcher/posix/progress_channel.h"

namespace ddprun::launcher {

// One local rank's worker in a round: its process, the pipes the agent
// talks to it through, and what the agent learned of that process. A new
// slot makes its pipes (ProgressChannel, ControlChannel; -1 descriptors
// when they cannot be made), and has no process until WorkerGroup starts or
// adopts one. Owned by WorkerGroup, on the agent's thread. Move-only: the
// pipes close with it.
struct WorkerSlot {
  pid_t pid = -1;      // -1: no process (yet)
  bool ended = false;  // reaped
  // The worker reports on `progress` (DDPRUN_PROGRESS_FD) and, when it
  // recovers in place, reads the next round's environment from `control`
  // (DDPRUN_CONTROL_FD).
  ProgressChannel progress;
  ControlChannel control;
  // The process declared in-place recovery (libddp): it stays declared in
  // the next rounds it continues into; a new process in the slot has not.
  bool declared_in_place = false;
  // The process has not reported a phase past its start (a replacement
  // still loading its program): a round it is kept into finds it there.
  bool starting = true;
};

}  // namespace ddprun::launcher
