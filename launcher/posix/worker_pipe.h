#pragma once

#include "common/unique_fd.h"

namespace ddprun::launcher {

// A pipe between the agent and one worker: the worker inherits one end (its
// "worker end"), the agent keeps the other. The one pipe class under both
// directions of the agent↔worker protocol: ProgressChannel (the worker
// writes) and ControlChannel (the agent writes). Owned by the agent's
// thread; move-only; closes what it holds.
class WorkerPipe {
 public:
  enum class WorkerEnd { kRead, kWrite };

  // Makes the pipe, both ends close-on-exec: the spawner clears the flag on
  // the worker end for its one worker only. When the pipe cannot be made
  // (no descriptors left), every fd is -1 and the worker gets no channel.
  explicit WorkerPipe(WorkerEnd worker_end);
  WorkerPipe(WorkerPipe&& other) noexcept;
  WorkerPipe& operator=(WorkerPipe&& other) noexcept;

  // The agent's end; -1 when there is no pipe.
  int agent_fd() const { return agent_end_.get(); }
  // The worker's end as the agent holds it, until CloseWorkerEnd; -1 then.
  int worker_fd() const { return worker_end_.get(); }
  // The worker end's number in the worker (still valid there after
  // CloseWorkerEnd); -1 when there is no pipe.
  int child_fd() const { return child_fd_; }
  // The number in a worker that got the end otherwise than by inheritance
  // at the same number (a zygote's fork: passed over a socket).
  void set_child_fd(int fd) { child_fd_ = fd; }
  // After the worker is spawned: the worker holds the only worker end, so
  // the agent sees end-of-file (or EPIPE) when the worker is gone.
  void CloseWorkerEnd() { worker_end_.Reset(); }

 private:
  common::UniqueFd agent_end_;
  common::UniqueFd worker_end_;
  int child_fd_ = -1;
};

}  // namespace ddprun::launcher
