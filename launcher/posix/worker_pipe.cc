#include "launcher/posix/worker_pipe.h"

#include <fcntl.h>

#include <utility>

namespace ddprun::launcher {

WorkerPipe::WorkerPipe(WorkerEnd worker_end) {
  auto pipe = common::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) return;
  if (worker_end == WorkerEnd::kRead) {
    worker_end_ = std::move(pipe->read);
    agent_end_ = std::move(pipe->write);
  } else {
    worker_end_ = std::move(pipe->write);
    agent_end_ = std::move(pipe->read);
  }
  child_fd_ = worker_end_.get();
}

WorkerPipe::WorkerPipe(WorkerPipe&& other) noexcept
    : agent_end_(std::move(other.agent_end_)),
      worker_end_(std::move(other.worker_end_)),
      child_fd_(std::exchange(other.child_fd_, -1)) {}

WorkerPipe& WorkerPipe::operator=(WorkerPipe&& other) noexcept {
  if (this != &other) {
    agent_end_ = std::move(other.agent_end_);
    worker_end_ = std::move(other.worker_end_);
    child_fd_ = std::exchange(other.child_fd_, -1);
  }
  return *this;
}

}  // namespace ddprun::launcher
