#include "launcher/posix/worker_group.h"

#include <signal.h>

namespace ddprun::launcher {

WorkerGroup::WorkerGroup(ProcessControl& control, const common::Clock& clock)
    : control_(control), clock_(clock) {}

WorkerGroup::~WorkerGroup() {
  // Also when every worker has exited: what they left in their process
  // groups (their own children) goes with them.
  if (!workers_.empty()) Stop(absl::ZeroDuration());
}

absl::Status WorkerGroup::Start(const std::vector<SpawnRequest>& requests,
                                absl::Duration grace) {
  workers_.clear();
  for (const SpawnRequest& request : requests) {
    absl::StatusOr<pid_t> pid = control_.Spawn(request);
    if (!pid.ok()) {
      Stop(grace);
      return pid.status();
    }
    workers_.push_back({*pid, false});
  }
  return absl::OkStatus();
}

void WorkerGroup::Adopt(const std::vector<pid_t>& pids) {
  workers_.clear();
  for (pid_t pid : pids) workers_.push_back({pid, false});
}

absl::Status WorkerGroup::Respawn(int local_rank, const SpawnRequest& request) {
  absl::StatusOr<pid_t> pid = control_.Spawn(request);
  if (!pid.ok()) return pid.status();
  AdoptAt(local_rank, *pid);
  return absl::OkStatus();
}

void WorkerGroup::AdoptAt(int local_rank, pid_t pid) {
  if (local_rank >= static_cast<int>(workers_.size())) {
    workers_.resize(local_rank + 1, {-1, true});
  }
  workers_[local_rank] = {pid, false};
}

void WorkerGroup::Kill(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  const Worker& w = workers_[local_rank];
  if (w.pid > 0) control_.SignalGroup(w.pid, SIGKILL);
}

bool WorkerGroup::Ended(int local_rank) const {
  return local_rank < 0 || local_rank >= static_cast<int>(workers_.size()) ||
         workers_[local_rank].ended;
}

std::vector<std::pair<int, ExitStatus>> WorkerGroup::Reap() {
  std::vector<std::pair<int, ExitStatus>> exits;
  while (std::optional<std::pair<pid_t, ExitStatus>> reaped =
             control_.ReapAny()) {
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      Worker& w = workers_[i];
      if (w.pid == reaped->first && !w.ended) {
        w.ended = true;
        exits.emplace_back(i, reaped->second);
      }
    }
  }
  return exits;
}

void WorkerGroup::SignalAll(int sig) {
  for (const Worker& w : workers_) {
    if (!w.ended) control_.SignalGroup(w.pid, sig);
  }
}

std::vector<std::pair<int, ExitStatus>> WorkerGroup::Stop(
    absl::Duration grace) {
  std::vector<std::pair<int, ExitStatus>> exits = Reap();
  // The whole group, not only the leader: a worker's own children go too,
  // even when the leader has already exited.
  for (const Worker& w : workers_) {
    control_.SignalGroup(w.pid, SIGTERM);
    // A stopped process acts on SIGTERM only once continued.
    if (!w.ended && control_.IsStopped(w.pid)) {
      control_.SignalGroup(w.pid, SIGCONT);
    }
  }
  absl::Time deadline = clock_.Now() + grace;
  while (true) {
    for (auto& e : Reap()) exits.push_back(e);
    if (AllEnded() || clock_.Now() >= deadline) break;
    control_.AwaitChildEvent(deadline - clock_.Now());
  }
  for (const Worker& w : workers_) control_.SignalGroup(w.pid, SIGKILL);
  while (true) {
    for (auto& e : Reap()) exits.push_back(e);
    if (AllEnded()) break;
    control_.AwaitChildEvent(absl::Milliseconds(5));
  }
  return exits;
}

bool WorkerGroup::AllEnded() const {
  for (const Worker& w : workers_) {
    if (!w.ended) return false;
  }
  return true;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const Worker& w : workers_) out.push_back(w.pid);
  return out;
}

}  // namespace ddprun::launcher
