#include "worker/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>

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

int Fsync(const SyncOptions& sync, int fd) {
  return sync.fsync ? sync.fsync(fd) : ::fsync(fd);
}

// Creates a new file next to `path` with mode 0666 less the umask (mkstemp
// would make it 0600 whatever the umask); its name goes to `tmp`. -1 with
// errno on failure.
int CreateTemporary(const std::string& path, std::string* tmp) {
  thread_local std::mt19937_64 bits(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    *tmp = absl::StrFormat("%s.tmp.%d.%016x", path, getpid(), bits());
    int fd = open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;  // errno is EEXIST
}

}  // namespace

absl::Status SyncFolder(const std::string& dir, const SyncOptions& sync) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || Fsync(sync, fd) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    return absl::DataLossError(absl::StrFormat(
        "cannot sync the folder %s (%s: %s), so its new entries may not "
        "survive a crash; check the file system (a full or failing disk?)",
        dir, fd < 0 ? "open" : "fsync", std::strerror(err)));
  }
  close(fd);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents,
                                 const SyncOptions& sync) {
  const std::string dir = Dirname(path);
  std::string tmp;
  int fd = CreateTemporary(path, &tmp);
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
  if (Fsync(sync, fd) != 0) return fail("fsync");
  if (close(fd) != 0) {
    fd = -1;
    return fail("close");
  }
  fd = -1;
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  // The rename is durable only once the folder is on disk.
  absl::Status synced = SyncFolder(dir, sync);
  if (!synced.ok()) {
    return absl::DataLossError(
        absl::StrFormat("wrote %s, but %s", path, synced.message()));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::worker
