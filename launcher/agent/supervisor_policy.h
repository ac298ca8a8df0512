#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/posix/exit_status.h"

namespace ddprun::launcher {

// A failed worker of this node, as the agent reports it.
struct LocalFailure {
  int local_rank = 0;
  ExitStatus exit;  // meaningless when cause is FAILURE_CAUSE_HUNG
  v1::FailureCause cause = v1::FAILURE_CAUSE_UNSPECIFIED;  // exited,
                                                           // signaled, hung
  absl::Time time;
};

struct SupervisorPolicyOptions {
  int num_workers = 1;
  // Silence after a first progress report that makes a worker hung; zero:
  // off. Workers that never report are never hung.
  absl::Duration worker_timeout = absl::ZeroDuration();
  // Which local ranks already declared in-place recovery (a previous round
  // of the same processes); missing entries: not declared.
  std::vector<bool> in_place;
};

// How the agent answers a failure of its own workers, or a new round that
// another node caused (no local failure).
struct RecoveryDecision {
  // Keep the surviving workers: send them the next round's environment
  // (DDPRUN_CONTROL_FD) instead of stopping them. Otherwise every worker
  // is stopped and the next round starts them afresh (torchrun's way).
  bool in_place = false;
  std::vector<int> replace;  // local ranks to start anew (ascending)
  std::vector<int> kill;     // of those, the ones still running (hung)
};

// Decides, from what was observed of one round's local workers, whether the
// group still runs, succeeded or failed. Pure: no processes, no sockets; time
// comes from the injected clock. Used by one thread (the agent's).
class SupervisorPolicy {
 public:
  enum class Verdict { kRunning, kSucceeded, kFailed };

  SupervisorPolicy(SupervisorPolicyOptions options, const common::Clock& clock);

  void OnExit(int local_rank, ExitStatus status);
  void OnProgress(int local_rank);
  // The worker said it recovers in place (libddp: worker/recovery.h).
  void OnInPlaceDeclared(int local_rank);
  // The worker is stopped (SIGSTOP): when some hung workers are, the others
  // that went silent with them are waiting for them, not hung themselves.
  // A running worker not hung yet (it reported no progress in this round)
  // becomes a hung failure.
  void OnStopped(int local_rank);

  // Also turns a worker silent past the worker timeout into a "hung" failure.
  Verdict Evaluate();

  // Oldest first: [0] is the root cause.
  const std::vector<LocalFailure>& failures() const { return failures_; }
  // The earliest time at which a running worker could become hung; nullopt
  // when none can (so the agent knows how long it may sleep).
  std::optional<absl::Time> NextHangDeadline() const;
  // How long the agent may sleep before it looks again: `monitor_interval`,
  // or less when a worker could become hung sooner (never negative).
  absl::Duration WaitBefore(absl::Duration monitor_interval) const;

  // In place only when every local worker declared it and none has ended
  // well (a worker that finished cannot take a new round): then the failed
  // ones (after Evaluate said kFailed; none for another node's failure) are
  // replaced and the hung ones among them killed first. A hang replaces only
  // the stopped workers when there are any (the rest wait for them in a
  // collective), else every hung one.
  RecoveryDecision DecideRecovery() const;
  // After kFailed in a round of `num_nodes`: true while every failure is a
  // hang of a worker that is not stopped and is younger than one more worker
  // timeout. Silent together with nothing stopped or exited here, they most
  // likely wait for a stopped or dead peer on another node, whose agent
  // reports it (a rejoin); killing them as hung would race that report.
  bool AwaitsRemoteCause(int num_nodes) const;
  // By local rank, for the next round of the same processes.
  std::vector<bool> in_place_declared() const;

 private:
  struct Worker {
    std::optional<ExitStatus> exit;
    std::optional<absl::Time> last_progress;
    bool hung = false;
    bool in_place = false;
    bool stopped = false;
  };

  SupervisorPolicyOptions options_;
  const common::Clock& clock_;
  std::vector<Worker> workers_;
  std::vector<LocalFailure> failures_;
};

}  // namespace ddprun::launcher
