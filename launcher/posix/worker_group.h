#pragma once

#include <sys/types.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "launcher/posix/exit_status.h"
#include "launcher/posix/process_control.h"

namespace ddprun::launcher {

// The local workers of one round: each the leader of its own process group.
// Owned and used by one thread, the one that spawned them (see
// ProcessControl). The destructor kills whatever still runs in the workers'
// process groups (SIGKILL), including children of workers that exited.
class WorkerGroup {
 public:
  WorkerGroup(ProcessControl& control, const common::Clock& clock);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one worker per request, local rank = index. When one cannot be
  // started, the ones already started are stopped and the error returned.
  absl::Status Start(const std::vector<SpawnRequest>& requests,
                     absl::Duration grace);

  // Takes processes started elsewhere (prewarmed workers, already in their
  // own process groups) as the workers, local rank = index.
  void Adopt(const std::vector<pid_t>& pids);

  // In-place recovery: local rank `local_rank` (ended, or killed by Kill)
  // becomes a new process, spawned from `request` or adopted (a prewarmed
  // worker). The old process, when reaped later, is dropped.
  absl::Status Respawn(int local_rank, const SpawnRequest& request);
  void AdoptAt(int local_rank, pid_t pid);
  // SIGKILL to one worker's process group (a hung worker replaced in place).
  void Kill(int local_rank);
  bool Ended(int local_rank) const;

  // Reaps what ended since the last call: (local rank, how it ended).
  // Reaped children that are not workers (grandchildren) are dropped.
  std::vector<std::pair<int, ExitStatus>> Reap();

  // Sends `sig` to every running worker's process group.
  void SignalAll(int sig);

  // Two phases: SIGTERM to every group, one shared deadline of `grace`,
  // SIGKILL to what is left, then reaps every worker. Returns the exits it
  // reaped, as Reap does.
  std::vector<std::pair<int, ExitStatus>> Stop(absl::Duration grace);

  bool AllEnded() const;
  std::vector<pid_t> pids() const;

 private:
  struct Worker {
    pid_t pid = -1;
    bool ended = false;
  };

  ProcessControl& control_;
  const common::Clock& clock_;
  std::vector<Worker> workers_;
};

}  // namespace ddprun::launcher
