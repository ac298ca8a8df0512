#include "common/unique_fd.h"

#include <errno.h>
#include <string.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddprun::common {

absl::StatusOr<PipeEnds> MakePipe(int flags) {
  int fds[2];
  if (pipe2(fds, flags) != 0) {
    const int error = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrCat("cannot make a pipe: ", strerror(error),
                     error == EMFILE || error == ENFILE
                         ? " (too many open files: raise the limit, ulimit -n)"
                         : ""));
  }
  return PipeEnds{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void SetNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace ddprun::common
