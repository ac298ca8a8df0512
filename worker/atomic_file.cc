#include "worker/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace ddprun::worker {
namespace {

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status Error(const std::string& path, const char* step, int err) {
  return absl::Status(
      err == ENOSPC || err == EDQUOT ? absl::StatusCode::kResourceExhausted
                                     : absl::StatusCode::kPermissionDenied,
      absl::StrFormat("cannot write %s (%s: %s); the previous file, if any, "
                      "is intact; free disk space or choose a writable "
                      "folder",
                      path, step, std::strerror(err)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string dir = Dirname(path);
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = mkstemp(tmp.data());
  if (fd < 0) return Error(path, "create a temporary file", errno);
  auto fail = [&](const char* step) {
    int err = errno;
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return Error(path, step, err);
  };
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write");
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (fchmod(fd, 0644) != 0) return fail("chmod");
  if (fsync(fd) != 0) return fail("fsync");
  if (close(fd) != 0) {
    fd = -1;
    return fail("close");
  }
  fd = -1;
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    // The rename is durable only once the folder is on disk.
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace ddprun::worker
