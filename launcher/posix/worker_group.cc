#include "launcher/posix/worker_group.h"

#include <signal.h>

namespace ddprun::launcher {
namespace {

bool HasProcess(const WorkerSlot& slot) { return slot.pid > 0; }

}  // namespace

WorkerGroup::WorkerGroup(ProcessControl& control, const common::Clock& clock)
    : control_(control), clock_(clock) {}

WorkerGroup::~WorkerGroup() {
  // Also when every worker has exited: what they left in their process
  // groups (their own children) goes with them.
  for (const WorkerSlot& slot : slots_) {
    if (HasProcess(slot)) {
      Stop(absl::ZeroDuration());
      break;
    }
  }
}

void WorkerGroup::OpenSlots(int n) {
  slots_.clear();
  slots_.resize(n);
}

absl::Status WorkerGroup::Start(const std::vector<SpawnRequest>& requests,
                                absl::Duration grace) {
  slots_.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<pid_t> pid = control_.Spawn(requests[i]);
    if (!pid.ok()) {
      Stop(grace);
      return pid.status();
    }
    WorkerSlot& slot = slots_[i];
    slot.pid = *pid;
    slot.ended = false;
    slot.declared_in_place = false;
    slot.starting = true;
  }
  return absl::OkStatus();
}

void WorkerGroup::Adopt(std::vector<WorkerSlot> slots) {
  slots_ = std::move(slots);
}

absl::Status WorkerGroup::Respawn(int local_rank, const SpawnRequest& request) {
  absl::StatusOr<pid_t> pid = control_.Spawn(request);
  if (!pid.ok()) return pid.status();
  if (local_rank >= size()) slots_.resize(local_rank + 1);
  WorkerSlot& slot = slots_[local_rank];
  slot.pid = *pid;
  slot.ended = false;
  slot.declared_in_place = false;
  slot.starting = true;
  return absl::OkStatus();
}

void WorkerGroup::AdoptAt(int local_rank, WorkerSlot slot) {
  if (local_rank >= size()) slots_.resize(local_rank + 1);
  slots_[local_rank] = std::move(slot);
}

void WorkerGroup::RenewPipes(int local_rank) {
  WorkerSlot& slot = slots_.at(local_rank);
  slot.progress = ProgressChannel();
  slot.control = ControlChannel();
}

void WorkerGroup::CloseWorkerEnds() {
  for (int i = 0; i < size(); ++i) CloseWorkerEnds(i);
}

void WorkerGroup::CloseWorkerEnds(int local_rank) {
  WorkerSlot& slot = slots_.at(local_rank);
  slot.progress.CloseWriteEnd();
  slot.control.CloseReadEnd();
}

void WorkerGroup::Kill(int local_rank) {
  if (local_rank < 0 || local_rank >= size()) return;
  const WorkerSlot& slot = slots_[local_rank];
  if (HasProcess(slot)) control_.SignalGroup(slot.pid, SIGKILL);
}

bool WorkerGroup::Ended(int local_rank) const {
  return local_rank < 0 || local_rank >= size() ||
         !HasProcess(slots_[local_rank]) || slots_[local_rank].ended;
}

std::vector<std::pair<int, ExitStatus>> WorkerGroup::Reap() {
  std::vector<std::pair<int, ExitStatus>> exits;
  while (std::optional<std::pair<pid_t, ExitStatus>> reaped =
             control_.ReapAny()) {
    for (int i = 0; i < size(); ++i) {
      WorkerSlot& slot = slots_[i];
      if (HasProcess(slot) && slot.pid == reaped->first && !slot.ended) {
        slot.ended = true;
        exits.emplace_back(i, reaped->second);
      }
    }
  }
  return exits;
}

void WorkerGroup::SignalAll(int sig) {
  for (const WorkerSlot& slot : slots_) {
    if (HasProcess(slot) && !slot.ended) control_.SignalGroup(slot.pid, sig);
  }
}

std::vector<std::pair<int, ExitStatus>> WorkerGroup::Stop(
    absl::Duration grace) {
  std::vector<std::pair<int, ExitStatus>> exits = Reap();
  // The whole group, not only the leader: a worker's own children go too,
  // even when the leader has already exited.
  for (const WorkerSlot& slot : slots_) {
    if (!HasProcess(slot)) continue;
    control_.SignalGroup(slot.pid, SIGTERM);
    // A stopped process acts on SIGTERM only once continued.
    if (!slot.ended && control_.IsStopped(slot.pid)) {
      control_.SignalGroup(slot.pid, SIGCONT);
    }
  }
  absl::Time deadline = clock_.Now() + grace;
  while (true) {
    for (auto& e : Reap()) exits.push_back(e);
    if (AllEnded() || clock_.Now() >= deadline) break;
    control_.AwaitChildEvent(deadline - clock_.Now());
  }
  for (const WorkerSlot& slot : slots_) {
    if (HasProcess(slot)) control_.SignalGroup(slot.pid, SIGKILL);
  }
  while (true) {
    for (auto& e : Reap()) exits.push_back(e);
    if (AllEnded()) break;
    control_.AwaitChildEvent(absl::Milliseconds(5));
  }
  return exits;
}

bool WorkerGroup::AllEnded() const {
  for (const WorkerSlot& slot : slots_) {
    if (HasProcess(slot) && !slot.ended) return false;
  }
  return true;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const WorkerSlot& slot : slots_) out.push_back(slot.pid);
  return out;
}

}  // namespace ddprun::launcher
