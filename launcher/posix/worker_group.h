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
#include "launcher/posix/worker_slot.h"

namespace ddprun::launcher {

// The local workers of one round: a slot per local rank (WorkerSlot: the
// process, its pipes, what the agent learned of it), each process the
// leader of its own process group. Owned and used by one thread, the one
// that spawned them (see ProcessControl). The destructor kills whatever
// still runs in the workers' process groups (SIGKILL), including children
// of workers that exited, then closes the slots' pipes.
class WorkerGroup {
 public:
  WorkerGroup(ProcessControl& control, const common::Clock& clock);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Makes `n` new slots, with fresh pipes and no process yet, in place of
  // the ones there were: the round's plan hands their worker ends to the
  // workers Start spawns.
  void OpenSlots(int n);
  // Starts one worker per request, local rank = index, into the open slots
  // (opened here where missing). When one cannot be started, the ones
  // already started are stopped and the error returned.
  absl::Status Start(const std::vector<SpawnRequest>& requests,
                     absl::Duration grace);

  // Takes processes started elsewhere (prewarmed workers, already in their
  // own process groups, with their own pipes) as the workers, local rank =
  // index.
  void Adopt(std::vector<WorkerSlot> slots);

  // In-place recovery: local rank `local_rank` (ended, or killed by Kill)
  // becomes a new process, spawned from `request` (with the slot's pipes,
  // which the caller renews first) or adopted with its own (a prewarmed
  // worker). The old process, when reaped later, is dropped.
  absl::Status Respawn(int local_rank, const SpawnRequest& request);
  void AdoptAt(int local_rank, WorkerSlot slot);
  // Fresh pipes in slot `local_rank`, for the process Respawn starts there
  // (the old ones close).
  void RenewPipes(int local_rank);
  // After the workers were spawned: they hold the only worker ends of their
  // pipes, so that the agent sees end-of-file (or EPIPE) once one is gone.
  void CloseWorkerEnds();
  void CloseWorkerEnds(int local_rank);
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

  int size() const { return static_cast<int>(slots_.size()); }
  WorkerSlot& slot(int local_rank) { return slots_.at(local_rank); }
  const WorkerSlot& slot(int local_rank) const { return slots_.at(local_rank); }

 private:
  ProcessControl& control_;
  const common::Clock& clock_;
  std::vector<WorkerSlot> slots_;
};

}  // namespace ddprun::launcher
