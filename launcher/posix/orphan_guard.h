#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::launcher {

// What is left when the agent dies without cleaning up (kill -9, an OOM
// kill): its workers die with it (PR_SET_PDEATHSIG), but not their own
// children, which share their process group, nor the node's folders
// (/dev/shm/ddprun-*, a temporary torchelastic_* log folder). The guard is a
// small process, started first, that outlives the agent: the agent tells it
// each worker's process group and each folder on a socket; when the socket
// closes without the agent saying it cleaned up ("done", at a normal end),
// the guard kills what is left in those groups and removes the folders.
//
// It runs as `ddprun --orphan-guard FD SESSION` (main.cc), in a session of
// its own, its standard streams on /dev/null (so that nobody reading the
// agent's output waits for it), re-parented to init (double fork). It kills
// only processes of the agent's session in the named groups: a group id
// reused by someone else's process is left alone.
//
// Thread-safe: each message is one send of a short line.
class OrphanGuard {
 public:
  // Starts the guard from `executable` (this program: /proc/self/exe).
  // Call before any thread exists (it forks).
  static absl::StatusOr<std::unique_ptr<OrphanGuard>> Start(
      const std::string& executable);
  // Tells the guard that everything was cleaned up, and lets it go.
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void WatchGroup(pid_t pgid);
  // Removed (recursively, links not followed) if the agent dies.
  void WatchPath(const std::string& path);
  // What the guard hands to its farewell (RunOrphanGuard) once it cleaned
  // up after a dead agent: opaque here (cli/ tells the rendezvous that the
  // node is gone). The last one sent counts. Any bytes.
  void SetFarewell(const std::string& farewell);

 private:
  explicit OrphanGuard(int fd) : fd_(fd) {}
  void Send(const std::string& line);

  int fd_;
};

// The guard's own loop (`ddprun --orphan-guard FD SESSION`): reads FD to its
// end, then cleans up unless told "done", and then calls `farewell` with
// what SetFarewell sent last, if anything. Returns the exit code.
int RunOrphanGuard(
    int fd, pid_t session,
    const std::function<void(const std::string&)>& farewell = nullptr);

}  // namespace ddprun::launcher
