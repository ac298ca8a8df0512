#include "launcher/posix/progress_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <utility>

namespace ddprun::launcher {

ProgressChannel::ProgressChannel() {
  int fds[2];
  // Both ends close-on-exec: the spawner clears the flag on the write end
  // for its one worker only.
  if (pipe2(fds, O_CLOEXEC) == 0) {
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    child_fd_ = fds[1];
    fcntl(read_fd_, F_SETFL, fcntl(read_fd_, F_GETFL) | O_NONBLOCK);
  }
}

ProgressChannel::~ProgressChannel() { Close(); }

ProgressChannel::ProgressChannel(ProgressChannel&& other) noexcept
    : read_fd_(std::exchange(other.read_fd_, -1)),
      write_fd_(std::exchange(other.write_fd_, -1)),
      child_fd_(std::exchange(other.child_fd_, -1)),
      in_place_(std::exchange(other.in_place_, false)),
      tail_(std::move(other.tail_)) {}

ProgressChannel& ProgressChannel::operator=(ProgressChannel&& other) noexcept {
  if (this != &other) {
    Close();
    read_fd_ = std::exchange(other.read_fd_, -1);
    write_fd_ = std::exchange(other.write_fd_, -1);
    child_fd_ = std::exchange(other.child_fd_, -1);
    in_place_ = std::exchange(other.in_place_, false);
    tail_ = std::move(other.tail_);
  }
  return *this;
}

void ProgressChannel::CloseWriteEnd() {
  if (write_fd_ >= 0) close(write_fd_);
  write_fd_ = -1;
}

bool ProgressChannel::Drain() {
  if (read_fd_ < 0) return false;
  bool any = false;
  char buffer[4096];
  while (true) {
    ssize_t n = read(read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      any = true;
      if (!in_place_) {
        static constexpr char kDeclaration[] = "inplace\n";
        constexpr size_t kLength = sizeof(kDeclaration) - 1;
        tail_.append(buffer, static_cast<size_t>(n));
        in_place_ = tail_.find(kDeclaration) != std::string::npos;
        if (tail_.size() > kLength) tail_.erase(0, tail_.size() - kLength);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // empty (EAGAIN) or closed (0)
  }
  return any;
}

void ProgressChannel::Close() {
  if (read_fd_ >= 0) close(read_fd_);
  CloseWriteEnd();
  read_fd_ = -1;
}

}  // namespace ddprun::launcher
