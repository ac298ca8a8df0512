#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::launcher {

// A folder in shared memory (tmpfs) that the agent's workers share for as
// long as the agent runs: what every local rank would otherwise build for
// itself, it builds once there (libddp keeps the decoded dataset there, so
// that N local ranks hold it once). Workers find it in DDPRUN_SHM_DIR.
//
// The agent holds a lock on `<dir>/agent.lock` while it lives; the folder is
// removed when the agent ends, and by the next agent on the machine when
// the agent died without cleaning up (kill -9): no lock, no owner.
class ShmDir {
 public:
  // Creates `<parent>/ddprun-XXXXXX` and takes its lock, after removing
  // abandoned ones. An error when `parent` is missing or not writable.
  static absl::StatusOr<std::unique_ptr<ShmDir>> Create(
      const std::string& parent = "/dev/shm");
  ~ShmDir();
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  ShmDir(std::string path, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd) {}

  std::string path_;
  int lock_fd_;
};

// Removes the `ddprun-*` folders in `parent` whose agent is gone (their
// lock is free), of this process' own user only: `parent` (/dev/shm) is
// every user's. A symbolic link is never followed, neither at that name nor
// inside the folder (a link is removed, not what it points to). Returns how
// many it removed.
int RemoveAbandonedShmDirs(const std::string& parent);

// The lock file's name inside a ShmDir.
inline constexpr char kShmDirLockFile[] = "agent.lock";

}  // namespace ddprun::launcher
