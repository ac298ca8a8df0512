#pragma once

#include <string>

#include "absl/status/status.h"

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
  ~ControlChannel();
  ControlChannel(ControlChannel&& other) noexcept;
  ControlChannel& operator=(ControlChannel&& other) noexcept;
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // The read end's number, in the agent and (inherited) in the worker; -1
  // when the pipe could not be made (the worker then gets no channel).
  int child_fd() const { return child_fd_; }
  // The read end's number in a worker that got it otherwise than by
  // inheritance at the same number (a zygote's fork: passed over a socket).
  void set_child_fd(int fd) { child_fd_ = fd; }
  // After the worker is spawned: the worker holds the only read end.
  void CloseReadEnd();
  // Writes `line` and a newline without blocking. Errors: no channel, the
  // worker is gone, or it does not read (the pipe is full).
  absl::Status Send(const std::string& line);

 private:
  void Close();

  int read_fd_ = -1;
  int write_fd_ = -1;
  int child_fd_ = -1;
};

}  // namespace ddprun::launcher
