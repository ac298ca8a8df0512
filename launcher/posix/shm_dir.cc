#include "launcher/posix/shm_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

constexpr char kPrefix[] = "ddprun-";

// The folder's lock, taken without waiting; -1 when another process holds
// it (or the folder is not ours to judge).
int TryLock(const std::string& dir, bool create) {
  std::string lock = dir + "/" + kShmDirLockFile;
  int fd = open(lock.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int RemoveAbandonedShmDirs(const std::string& parent) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename();
    if (!absl::StartsWith(name, kPrefix) || !entry.is_directory(ec)) continue;
    // Only folders with a lock file are ddprun agents' (one being created
    // has no lock file for a moment: leave it).
    int fd = TryLock(entry.path(), /*create=*/false);
    if (fd < 0) continue;
    std::filesystem::remove_all(entry.path(), ec);
    close(fd);
    if (!ec) {
      ++removed;
      spdlog::info("removed {}, left by an agent that did not end cleanly",
                   entry.path().string());
    }
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<ShmDir>> ShmDir::Create(const std::string& parent) {
  if (access(parent.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a writable folder (%s); workers will not share memory",
        parent, std::strerror(errno)));
  }
  RemoveAbandonedShmDirs(parent);
  std::string path = absl::StrFormat("%s/%sXXXXXX", parent, kPrefix);
  if (mkdtemp(path.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create a folder in %s: %s", parent, std::strerror(errno)));
  }
  int fd = TryLock(path, /*create=*/true);
  if (fd < 0) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot lock %s/%s", path, kShmDirLockFile));
  }
  return std::unique_ptr<ShmDir>(new ShmDir(std::move(path), fd));
}

ShmDir::~ShmDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  close(lock_fd_);
}

}  // namespace ddprun::launcher
