#include "launcher/posix/shm_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/unique_fd.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

constexpr char kPrefix[] = "ddprun-";

// The names in the folder open at `dir_fd` (without . and ..).
std::vector<std::string> Names(int dir_fd) {
  std::vector<std::string> names;
  int fd = dup(dir_fd);
  if (fd < 0) return names;
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return names;
  }
  rewinddir(dir);
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  closedir(dir);
  return names;
}

// Removes `name` in the folder open at `parent_fd`, and everything below it,
// through descriptors only and never following a symbolic link: a link is
// removed, not what it points to. Hand-written because
// std::filesystem::remove_all works on paths, where a folder checked one
// moment can be a link the next. Returns false when something stayed.
bool RemoveAt(int parent_fd, const std::string& name) {
  struct stat st;
  if (fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT;
  }
  if (!S_ISDIR(st.st_mode)) {
    return unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT;
  }
  common::UniqueFd dir(openat(parent_fd, name.c_str(),
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.get() < 0) return false;
  bool all = true;
  for (const std::string& child : Names(dir.get())) {
    all = RemoveAt(dir.get(), child) && all;
  }
  return all && (unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0 ||
                 errno == ENOENT);
}

// The folder's lock, taken without waiting; -1 when there is no lock file,
// when another process holds it, or when it is no regular file of `owner`
// (not ours to judge).
int TryLockAt(int dir_fd, uid_t owner) {
  int fd = openat(dir_fd, kShmDirLockFile, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner ||
      flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Removes the folder at `path`, not following links (see RemoveAt).
void RemovePath(const std::string& path) {
  std::string::size_type slash = path.rfind('/');
  std::string parent = slash == std::string::npos ? "." : path.substr(0, slash);
  if (parent.empty()) parent = "/";
  common::UniqueFd parent_fd(
      open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent_fd.get() < 0 ||
      !RemoveAt(parent_fd.get(), path.substr(slash + 1))) {
    spdlog::warn("could not remove all of {}", path);
  }
}

}  // namespace

int RemoveAbandonedShmDirs(const std::string& parent) {
  common::UniqueFd parent_fd(
      open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent_fd.get() < 0) return 0;
  const uid_t self = geteuid();
  int removed = 0;
  for (const std::string& name : Names(parent_fd.get())) {
    if (!absl::StartsWith(name, kPrefix)) continue;
    // Only a real folder (not a link to one) of this agent's own user: the
    // parent is shared by every user of the machine.
    struct stat st;
    if (fstatat(parent_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != self) {
      continue;
    }
    common::UniqueFd dir(
        openat(parent_fd.get(), name.c_str(),
               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat opened;
    if (dir.get() < 0 || fstat(dir.get(), &opened) != 0 ||
        opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) {
      continue;  // replaced since it was looked at
    }
    // Only folders with a lock file are ddprun agents' (one being created
    // has no lock file for a moment: leave it).
    common::UniqueFd lock(TryLockAt(dir.get(), self));
    if (lock.get() < 0) continue;
    if (RemoveAt(parent_fd.get(), name)) {
      ++removed;
      spdlog::info("removed {}/{}, left by an agent that did not end cleanly",
                   parent, name);
    }
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<ShmDir>> ShmDir::Create(
    const std::string& parent) {
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
  common::UniqueFd dir(
      open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  // The lock file appears already locked: locked under another name, then
  // renamed. Created and locked at its own name, another agent starting at
  // the same moment could open it in between, find it free, take this
  // folder for abandoned and remove it (found by the fault harness, whose
  // two agents start together: every round of one failed, 435 times).
  int fd = -1;
  if (dir.get() >= 0) {
    fd = openat(dir.get(), "agent.lock.new",
                O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0 && (flock(fd, LOCK_EX | LOCK_NB) != 0 ||
                    renameat(dir.get(), "agent.lock.new", dir.get(),
                             kShmDirLockFile) != 0)) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    RemovePath(path);
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot lock %s/%s", path, kShmDirLockFile));
  }
  return std::unique_ptr<ShmDir>(new ShmDir(std::move(path), fd));
}

ShmDir::~ShmDir() {
  RemovePath(path_);
  close(lock_fd_);
}

}  // namespace ddprun::launcher
