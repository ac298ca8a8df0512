#pragma once

#include <string>
#include <vector>

#include "common/progress_record.h"
#include "launcher/posix/worker_pipe.h"

namespace ddprun::launcher {

// The pipe one worker reports progress through (DDPRUN_PROGRESS_FD): the
// worker writes one line per record (common/progress_record.h: phases,
// steps, the in-place declaration) to the write end; the agent drains the
// read end without blocking and gets the complete lines as records.
// Owned by the agent's thread. Move-only; closes its descriptors.
class ProgressChannel {
 public:
  ProgressChannel();

  // -1 when the pipe could not be made (the worker then gets no channel).
  int write_fd() const { return pipe_.worker_fd(); }
  // The write end's number in the worker (still valid there after
  // CloseWriteEnd); -1 when there is no channel.
  int child_fd() const { return pipe_.child_fd(); }
  // The write end's number in a worker that got it otherwise than by
  // inheritance at the same number (a zygote's fork: passed over a socket).
  void set_child_fd(int fd) { pipe_.set_child_fd(fd); }
  // After the worker is spawned: the worker holds the only write end.
  void CloseWriteEnd() { pipe_.CloseWorkerEnd(); }
  // Reads what is there and returns its complete lines, parsed, oldest
  // first (a line split across reads comes whole at the next Drain).
  std::vector<common::ProgressRecord> Drain();
  // Whether the worker has written the line "inplace" so far.
  bool declared_in_place() const { return in_place_; }

 private:
  WorkerPipe pipe_{WorkerPipe::WorkerEnd::kWrite};
  bool in_place_ = false;
  std::string partial_;  // a line not yet ended
};

}  // namespace ddprun::launcher
