#include "launcher/posix/control_channel.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "absl/strings/str_format.h"

namespace ddprun::launcher {

ControlChannel::ControlChannel() {
  // A worker that does not read costs the agent an error, never a block.
  if (pipe_.agent_fd() >= 0) common::SetNonBlocking(pipe_.agent_fd());
}

absl::Status ControlChannel::Send(const std::string& line) {
  if (pipe_.agent_fd() < 0) {
    return absl::FailedPreconditionError("the worker has no control channel");
  }
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    // MSG_NOSIGNAL is for sockets; a gone reader would raise SIGPIPE,
    // which the agent ignores (EPIPE comes back instead).
    ssize_t n = write(pipe_.agent_fd(), data.data() + done, data.size() - done);
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

}  // namespace ddprun::launcher
