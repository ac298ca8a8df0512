#pragma once

#include <string>

#include "absl/status/status.h"
#include "launcher/posix/worker_pipe.h"

namespace ddprun::launcher {

// The pipe the agent announces a new round through (DDPRUN_CONTROL_FD), the
// reverse of ProgressChannel: the worker inherits the read end, the agent
// writes one line per round (the round's complete environment as a JSON
// object of strings) to a worker that recovers in place (libddp:
// worker/recovery.h). Owned by the agent's thread. Move-only; closes its
// descriptors.
class ControlChannel {
 public:
  ControlChannel();

  // The read end's number, in the agent and (inherited) in the worker; -1
  // when the pipe could not be made (the worker then gets no channel).
  int child_fd() const { return pipe_.child_fd(); }
  // The read end's number in a worker that got it otherwise than by
  // inheritance at the same number (a zygote's fork: passed over a socket).
  void set_child_fd(int fd) { pipe_.set_child_fd(fd); }
  // After the worker is spawned: the worker holds the only read end.
  void CloseReadEnd() { pipe_.CloseWorkerEnd(); }
  // Writes `line` and a newline without blocking. Errors: no channel, the
  // worker is gone, or it does not read (the pipe is full).
  absl::Status Send(const std::string& line);

 private:
  WorkerPipe pipe_{WorkerPipe::WorkerEnd::kRead};
};

}  // namespace ddprun::launcher
