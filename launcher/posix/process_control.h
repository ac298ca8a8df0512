#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/posix/exit_status.h"
#include "launcher/posix/orphan_guard.h"
#include "launcher/posix/process_state.h"

namespace ddprun::launcher {

// One process to start. Everything is prepared before fork.
struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is looked up in the env's PATH
  std::vector<std::string> env;   // the complete environment, NAME=value
  int stdout_fd = -1;             // -1: inherit the agent's
  int stderr_fd = -1;
  // Descriptors the process keeps across exec, at the same numbers.
  std::vector<int> inherit_fds;
  // Starts it under SCHED_IDLE: it runs only on CPU time nothing else wants
  // (a prewarmed standby getting ready beside the training it will join).
  // RestoreNormalPriority undoes it.
  bool idle_priority = false;
};

// The seam between supervision and the operating system: the agent uses the
// POSIX implementation, policy tests a fake. All calls come from the one
// thread that owns the workers (the fork must happen on a thread that lives as
// long as the workers, because PR_SET_PDEATHSIG fires when it exits).
class ProcessControl {
 public:
  virtual ~ProcessControl() = default;
  // Starts the process as the leader of a new process group (pgid == pid).
  virtual absl::StatusOr<pid_t> Spawn(const SpawnRequest& request) = 0;
  virtual void SignalGroup(pid_t pgid, int sig) = 0;
  // Reaps one ended child, if any, without blocking. Grandchildren that were
  // re-parented to the agent (it is a subreaper) are reaped here too.
  virtual std::optional<std::pair<pid_t, ExitStatus>> ReapAny() = 0;
  // Waits up to `max` for a child to change state (or returns earlier).
  virtual void AwaitChildEvent(absl::Duration max) = 0;
  // Whether `pid` is stopped (state T: SIGSTOP, SIGTSTP): a hang's culprit
  // rather than a worker waiting for it. Not a process held by a debugger
  // (state t). False when unknown.
  virtual bool IsStopped(pid_t pid) { return false; }
  // Its state, CPU time, I/O and children at this look (process_state.h:
  // ReadProcessActivity); nullopt when unknown.
  virtual std::optional<ProcessState> State(pid_t pid) { return std::nullopt; }
  // Whether RestoreNormalPriority can succeed here (moving a process off
  // SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE that allows the nice
  // value): only then may a process be started with idle_priority.
  virtual bool CanRestoreNormalPriority() { return false; }
  // Puts every thread of `pid`, started with idle_priority, back under the
  // normal policy (SCHED_OTHER, its nice value unchanged).
  virtual absl::Status RestoreNormalPriority(pid_t pid) {
    return absl::OkStatus();
  }
  // Whether this process adopts its children's orphans (it is a child
  // subreaper): only then can a spawned process fork children that this
  // one reaps and supervises as its own (StandbyPool's zygote).
  virtual bool AdoptsOrphans() { return false; }
};

// fork + exec with the contract of STYLE.md: in the child only
// async-signal-safe calls (signal mask reset, setpgid, PR_SET_PDEATHSIG with a
// re-check of the parent, dup2, exec); an exec failure comes back through a
// close-on-exec pipe as a clear error.
class PosixProcessControl final : public ProcessControl {
 public:
  // `guard` (optional, outlives this) learns each spawned process group.
  explicit PosixProcessControl(OrphanGuard* guard = nullptr) : guard_(guard) {}

  absl::StatusOr<pid_t> Spawn(const SpawnRequest& request) override;
  void SignalGroup(pid_t pgid, int sig) override;
  std::optional<std::pair<pid_t, ExitStatus>> ReapAny() override;
  void AwaitChildEvent(absl::Duration max) override;
  bool IsStopped(pid_t pid) override;
  std::optional<ProcessState> State(pid_t pid) override;
  bool CanRestoreNormalPriority() override;
  absl::Status RestoreNormalPriority(pid_t pid) override;
  bool AdoptsOrphans() override;

 private:
  OrphanGuard* guard_;
};

// Whether a process with effective capabilities `cap_eff` (the CapEff mask
// of /proc/self/status), RLIMIT_NICE `nice_limit` and nice value `nice` may
// move a child of the same nice value from SCHED_IDLE back to SCHED_OTHER
// (sched(7): CAP_SYS_NICE, or 20 - nice <= RLIMIT_NICE).
bool MayLeaveIdlePolicy(uint64_t cap_eff, uint64_t nice_limit, int nice);

// Makes this process a child subreaper, so that orphaned grandchildren of
// the workers (e.g. data-loader processes) are re-parented to it and reaped.
absl::Status BecomeSubreaper();

// Resolves `program` as execvp would, with the PATH found in `env` (or the
// agent's). NOT_FOUND with a clear message when there is nothing to run.
absl::StatusOr<std::string> ResolveProgram(const std::string& program,
                                           const std::vector<std::string>& env);

}  // namespace ddprun::launcher
