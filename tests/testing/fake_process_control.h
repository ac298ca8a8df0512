#pragma once

#include <signal.h>
#include <sys/types.h>

#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "launcher/posix/exit_status.h"
#include "launcher/posix/process_control.h"

namespace ddprun::testing {

// The one fake of the ProcessControl seam (launcher/posix/process_control.h)
// for the unit tests of what drives it (WorkerGroup, StandbyPool, Agent):
// processes that exist only in memory. Each spawn gets the next pid; a
// signal ends a process as `ends_on` says (SIGTERM and SIGKILL by default);
// `exit_when` lets a test end processes by themselves; waiting for a child
// event advances the fake clock when nothing has ended. Not thread-safe:
// the thread that drives the code under test uses it.
class FakeProcessControl : public launcher::ProcessControl {
 public:
  struct Process {
    pid_t pid = 0;
    launcher::SpawnRequest request;
    bool alive = true;
    std::vector<int> signals;  // those it got while alive, in order
  };

  // Without a clock, AwaitChildEvent returns at once.
  explicit FakeProcessControl(common::FakeClock* clock = nullptr,
                              pid_t first_pid = 1000)
      : clock_(clock), next_pid_(first_pid) {}

  // Hooks; each may be left as it is.
  // A spawn it refuses fails with its status (default: none).
  std::function<absl::Status(const launcher::SpawnRequest&)> refuse_spawn =
      [](const launcher::SpawnRequest&) { return absl::OkStatus(); };
  // Called with each process spawned, before Spawn returns its pid.
  std::function<void(Process&)> on_spawn = [](Process&) {};
  // Whether `sig` ends the process (it then exits by that signal).
  std::function<bool(const Process&, int sig)> ends_on =
      [](const Process&, int sig) { return sig == SIGTERM || sig == SIGKILL; };
  // Asked about each running process at every ReapAny: how it ends now, or
  // nullopt while it runs on (default: it runs until signalled).
  std::function<std::optional<launcher::ExitStatus>(const Process&)> exit_when =
      [](const Process&) { return std::nullopt; };
  // What CanRestoreNormalPriority answers (StandbyPool's idle standbys).
  bool can_restore_normal_priority = false;

  absl::StatusOr<pid_t> Spawn(const launcher::SpawnRequest& request) override {
    if (absl::Status refused = refuse_spawn(request); !refused.ok()) {
      return refused;
    }
    processes_.push_back({next_pid_++, request});
    on_spawn(processes_.back());
    return processes_.back().pid;
  }

  void SignalGroup(pid_t pgid, int sig) override {
    signals_.emplace_back(pgid, sig);
    Process* p = Find(pgid);
    if (p == nullptr || !p->alive) return;
    p->signals.push_back(sig);
    if (ends_on(*p, sig)) End(pgid, launcher::ExitStatus::Signaled(sig));
  }

  std::optional<std::pair<pid_t, launcher::ExitStatus>> ReapAny() override {
    for (Process& p : processes_) {
      if (!p.alive) continue;
      if (std::optional<launcher::ExitStatus> exit = exit_when(p)) {
        End(p.pid, *exit);
      }
    }
    if (ended_.empty()) return std::nullopt;
    auto front = ended_.front();
    ended_.pop_front();
    return front;
  }

  void AwaitChildEvent(absl::Duration max) override {
    if (ended_.empty() && clock_ != nullptr) clock_->Advance(max);
  }

  bool CanRestoreNormalPriority() override {
    return can_restore_normal_priority;
  }
  absl::Status RestoreNormalPriority(pid_t pid) override {
    restored_.push_back(pid);
    return absl::OkStatus();
  }

  // Ends `pid` with `status`, to be reaped; a pid it never spawned stands
  // for a re-parented grandchild.
  void End(pid_t pid, launcher::ExitStatus status) {
    if (Process* p = Find(pid)) p->alive = false;
    ended_.emplace_back(pid, status);
  }

  Process* Find(pid_t pid) {
    for (Process& p : processes_) {
      if (p.pid == pid) return &p;
    }
    return nullptr;
  }

  // Every process spawned, oldest first (references stay valid).
  std::deque<Process>& processes() { return processes_; }
  std::set<pid_t> running() const {
    std::set<pid_t> out;
    for (const Process& p : processes_) {
      if (p.alive) out.insert(p.pid);
    }
    return out;
  }
  // Every SignalGroup call, in order, also to processes already gone.
  const std::vector<std::pair<pid_t, int>>& signals() const { return signals_; }
  // The pids RestoreNormalPriority was called for, in order.
  const std::vector<pid_t>& restored() const { return restored_; }

 private:
  common::FakeClock* clock_;
  pid_t next_pid_;
  std::deque<Process> processes_;
  std::deque<std::pair<pid_t, launcher::ExitStatus>> ended_;
  std::vector<std::pair<pid_t, int>> signals_;
  std::vector<pid_t> restored_;
};

}  // namespace ddprun::testing
