#include "launcher/agent/supervisor_policy.h"

#include <algorithm>

namespace ddprun::launcher {

SupervisorPolicy::SupervisorPolicy(SupervisorPolicyOptions options,
                                   const common::Clock& clock)
    : options_(options), clock_(clock), workers_(options.num_workers) {
  for (int i = 0; i < static_cast<int>(workers_.size()) &&
                  i < static_cast<int>(options_.in_place.size());
       ++i) {
    workers_[i].in_place = options_.in_place[i];
  }
}

void SupervisorPolicy::OnExit(int local_rank, ExitStatus status) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& worker = workers_[local_rank];
  if (worker.exit) return;
  worker.exit = status;
  // A worker already declared hung was killed by us; its exit is not news.
  if (!status.success() && !worker.hung) {
    failures_.push_back({local_rank, status,
                         status.signal != 0 ? v1::FAILURE_CAUSE_SIGNALED
                                            : v1::FAILURE_CAUSE_EXITED,
                         clock_.Now()});
  }
}

void SupervisorPolicy::OnProgress(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  workers_[local_rank].last_progress = clock_.Now();
}

void SupervisorPolicy::OnInPlaceDeclared(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  workers_[local_rank].in_place = true;
}

void SupervisorPolicy::OnStopped(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& worker = workers_[local_rank];
  worker.stopped = true;
  // Stopped before it reported progress in this round (a survivor in the
  // state sync of an in-place round): hung all the same.
  if (!worker.exit && !worker.hung) {
    worker.hung = true;
    failures_.push_back(
        {local_rank, ExitStatus{}, v1::FAILURE_CAUSE_HUNG, clock_.Now()});
  }
}

RecoveryDecision SupervisorPolicy::DecideRecovery() const {
  RecoveryDecision decision;
  for (const Worker& w : workers_) {
    if (!w.in_place) return decision;
    if (w.exit && w.exit->success()) return decision;
  }
  decision.in_place = true;
  bool some_stopped = false;
  for (const LocalFailure& f : failures_) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG && workers_[f.local_rank].stopped) some_stopped = true;
  }
  for (const LocalFailure& f : failures_) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG && some_stopped && !workers_[f.local_rank].stopped) {
      continue;  // silent because it waits for the stopped one
    }
    if (std::find(decision.replace.begin(), decision.replace.end(),
                  f.local_rank) != decision.replace.end()) {
      continue;
    }
    decision.replace.push_back(f.local_rank);
    if (!workers_[f.local_rank].exit) decision.kill.push_back(f.local_rank);
  }
  std::sort(decision.replace.begin(), decision.replace.end());
  std::sort(decision.kill.begin(), decision.kill.end());
  return decision;
}

std::vector<bool> SupervisorPolicy::in_place_declared() const {
  std::vector<bool> out;
  for (const Worker& w : workers_) out.push_back(w.in_place);
  return out;
}

SupervisorPolicy::Verdict SupervisorPolicy::Evaluate() {
  absl::Time now = clock_.Now();
  if (options_.worker_timeout > absl::ZeroDuration()) {
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      Worker& w = workers_[i];
      if (w.exit || w.hung || !w.last_progress) continue;
      if (now - *w.last_progress >= options_.worker_timeout) {
        w.hung = true;
        failures_.push_back({i, ExitStatus{}, v1::FAILURE_CAUSE_HUNG, now});
      }
    }
  }
  if (!failures_.empty()) return Verdict::kFailed;
  for (const Worker& w : workers_) {
    if (!w.exit) return Verdict::kRunning;
  }
  return Verdict::kSucceeded;
}

std::optional<absl::Time> SupervisorPolicy::NextHangDeadline() const {
  if (options_.worker_timeout <= absl::ZeroDuration()) return std::nullopt;
  std::optional<absl::Time> next;
  for (const Worker& w : workers_) {
    if (w.exit || w.hung || !w.last_progress) continue;
    absl::Time deadline = *w.last_progress + options_.worker_timeout;
    if (!next || deadline < *next) next = deadline;
  }
  return next;
}

absl::Duration SupervisorPolicy::WaitBefore(
    absl::Duration monitor_interval) const {
  std::optional<absl::Time> hang = NextHangDeadline();
  if (!hang.has_value()) return monitor_interval;
  return std::max(absl::ZeroDuration(),
                  std::min(monitor_interval, *hang - clock_.Now()));
}

bool SupervisorPolicy::AwaitsRemoteCause(int num_nodes) const {
  if (num_nodes <= 1 || failures_.empty()) return false;
  for (const LocalFailure& f : failures_) {
    if (f.cause != v1::FAILURE_CAUSE_HUNG || workers_[f.local_rank].stopped ||
        clock_.Now() - f.time >= options_.worker_timeout) {
      return false;
    }
  }
  return true;
}

}  // namespace ddprun::launcher
