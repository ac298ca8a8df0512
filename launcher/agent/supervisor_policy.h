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

  // Also turns a worker silent past the worker timeout into a "hung" failure.
  Verdict Evaluate();

  // Oldest first: [0] is the root cause.
  const std::vector<LocalFailure>& failures() const { return failures_; }
  // The earliest time at which a running worker could become hung; nullopt
  // when none can (so the agent knows how long it may sleep).
  std::optional<absl::Time> NextHangDeadline() const;

 private:
  struct Worker {
    std::optional<ExitStatus> exit;
    std::optional<absl::Time> last_progress;
    bool hung = false;
  };

  SupervisorPolicyOptions options_;
  const common::Clock& clock_;
  std::vector<Worker> workers_;
  std::vector<LocalFailure> failures_;
};

}  // namespace ddprun::launcher
