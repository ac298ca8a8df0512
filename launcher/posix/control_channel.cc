#include "launcher/posix/control_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_format.h"

namespace ddprun::launcher {

ControlChannel::ControlChannel() {
  int fds[2];
  // Both ends close-on-exec: the spawner clears the flag on the read end
  // for its one worker only.
  if (pipe2(fds, O_CLOEXEC) == 0) {
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    child_fd_ = fds[0];
    fcntl(write_fd_, F_SETFL, fcntl(write_fd_, F_GETFL) | O_NONBLOCK);
  }
}

ControlChannel::~ControlChannel() { Close(); }

ControlChannel::ControlChannel(ControlChannel&& other) noexcept
    : read_fd_(std::exchange(other.read_fd_, -1)),
      write_fd_(std::exchange(other.write_fd_, -1)),
      child_fd_(std::exchange(other.child_fd_, -1)) {}

ControlChannel& ControlChannel::operator=(ControlChannel&& other) noexcept {
  if (this != &other) {
    Close();
    read_fd_ = std::exchange(other.read_fd_, -1);
    write_fd_ = std::exchange(other.write_fd_, -1);
    child_fd_ = std::exchange(other.child_fd_, -1);
  }
  return *this;
}

void ControlChannel::CloseReadEnd() {
  if (read_fd_ >= 0) close(read_fd_);
  read_fd_ = -1;
}

absl::Status ControlChannel::Send(const std::string& line) {
  if (write_fd_ < 0) {
    return absl::FailedPreconditionError("the worker has no control channel");
  }
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    // MSG_NOSIGNAL is for sockets; a gone reader would raise SIGPIPE,
    // which the agent ignores (EPIPE comes back instead).
    ssize_t n = write(write_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrFormat("cannot tell the worker its next round: %s",
                          n < 0 ? strerror(errno) : "short write"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void ControlChannel::Close() {
  CloseReadEnd();
  if (write_fd_ >= 0) close(write_fd_);
  write_fd_ = -1;
}

}  // namespace ddprun::launcher
