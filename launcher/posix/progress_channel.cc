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
    // The worker's writes never block either (the flag belongs to the open
    // pipe, so it crosses fork and exec): an agent that is behind, or
    // stopped, costs records, never a worker's step.
    fcntl(write_fd_, F_SETFL, fcntl(write_fd_, F_GETFL) | O_NONBLOCK);
  }
}

ProgressChannel::~ProgressChannel() { Close(); }

ProgressChannel::ProgressChannel(ProgressChannel&& other) noexcept
    : read_fd_(std::exchange(other.read_fd_, -1)),
      write_fd_(std::exchange(other.write_fd_, -1)),
      child_fd_(std::exchange(other.child_fd_, -1)),
      in_place_(std::exchange(other.in_place_, false)),
      partial_(std::move(other.partial_)) {}

ProgressChannel& ProgressChannel::operator=(ProgressChannel&& other) noexcept {
  if (this != &other) {
    Close();
    read_fd_ = std::exchange(other.read_fd_, -1);
    write_fd_ = std::exchange(other.write_fd_, -1);
    child_fd_ = std::exchange(other.child_fd_, -1);
    in_place_ = std::exchange(other.in_place_, false);
    partial_ = std::move(other.partial_);
  }
  return *this;
}

void ProgressChannel::CloseWriteEnd() {
  if (write_fd_ >= 0) close(write_fd_);
  write_fd_ = -1;
}

std::vector<common::ProgressRecord> ProgressChannel::Drain() {
  std::vector<common::ProgressRecord> records;
  if (read_fd_ < 0) return records;
  // A worker writes short lines; one longer than this is not ours, and is
  // cut rather than kept growing.
  constexpr size_t kMaxLine = 4096;
  char buffer[4096];
  while (true) {
    ssize_t n = read(read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      partial_.append(buffer, static_cast<size_t>(n));
      size_t begin = 0;
      for (size_t end; (end = partial_.find('\n', begin)) != std::string::npos;
           begin = end + 1) {
        records.push_back(common::ParseProgressRecord(
            absl::string_view(partial_).substr(begin, end - begin)));
        if (records.back().kind == common::ProgressRecord::Kind::kInPlace) {
          in_place_ = true;
        }
      }
      partial_.erase(0, begin);
      if (partial_.size() > kMaxLine) {
        records.push_back({});  // a sign of life all the same
        partial_.clear();
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // empty (EAGAIN) or closed (0)
  }
  return records;
}

void ProgressChannel::Close() {
  if (read_fd_ >= 0) close(read_fd_);
  CloseWriteEnd();
  read_fd_ = -1;
}

}  // namespace ddprun::launcher
