#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "launcher/posix/control_channel.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/progress_channel.h"

namespace ddprun::launcher {

// Workers started ahead of their round (--prewarm), so that a restart does
// not wait for an interpreter and LibTorch to start: a standby runs up to
// the point where it needs its round's environment (for Python, the shim of
// python_standby.h imports torch), then blocks reading the descriptor named
// by DDPRUN_STANDBY_FD. Activate writes the worker's complete environment
// there (a JSON object of strings) and closes it; the standby then becomes
// the worker. Where the agent may move them back (ProcessControl::
// CanRestoreNormalPriority), standbys start under SCHED_IDLE, so that their
// start-up (~0.9 CPU-s of LibTorch) takes only CPU time the training beside
// them leaves; Activate puts each back under the normal policy before it is
// told its round, and PromoteLate does after StandbyPoolOptions::idle_grace
// (a machine with no idle CPU would otherwise never let it get ready).
// Owned and used by the agent's thread (it forks).
struct StandbyPoolOptions {
  // How long a standby may start under SCHED_IDLE before PromoteLate moves
  // it to the normal policy.
  absl::Duration idle_grace = absl::Seconds(5);
};

class StandbyPool {
 public:
  // `argv` runs a standby; `env` is its environment before activation.
  StandbyPool(ProcessControl& control, const common::Clock& clock,
              std::vector<std::string> argv, std::vector<std::string> env,
              StandbyPoolOptions options = {});
  // Kills the standbys still waiting.
  ~StandbyPool();
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  // Makes `count` standbys wait (starting the missing ones). A standby that
  // cannot be started is logged and left out.
  void Fill(int count);
  int size() const { return static_cast<int>(standbys_.size()); }
  // Whether standbys start under SCHED_IDLE.
  bool idle_start() const { return idle_start_; }
  // The progress descriptor standby `i` inherited (for DDPRUN_PROGRESS_FD).
  int progress_fd(int i) const;
  // The control descriptor standby `i` inherited (for DDPRUN_CONTROL_FD:
  // the rounds after its first, in-place recovery).
  int control_fd(int i) const;

  // Turns the first envs.size() standbys into workers: each gets envs[i].
  // Returns their pids and appends their progress channels to `progress`
  // (and their control channels to `controls` when given).
  // When one cannot be told (it died), every standby is killed and the
  // error returned; the caller then starts workers the ordinary way.
  absl::StatusOr<std::vector<pid_t>> Activate(
      const std::vector<std::vector<std::string>>& envs,
      std::vector<ProgressChannel>& progress,
      std::vector<ControlChannel>* controls = nullptr);

  // Kills every waiting standby.
  void Clear();

  // Moves the standbys that started idle more than idle_grace ago to the
  // normal policy (once each). Cheap when there are none: call it often.
  void PromoteLate();

 private:
  struct Standby {
    pid_t pid = -1;
    int control_fd = -1;  // write end; the standby reads the other
    ProgressChannel progress;
    ControlChannel control;  // the rounds after activation
    absl::Time started;
    bool idle = false;  // still under SCHED_IDLE
  };

  ProcessControl& control_;
  const common::Clock& clock_;
  StandbyPoolOptions options_;
  std::vector<std::string> argv_;
  std::vector<std::string> env_;
  bool idle_start_;
  std::vector<Standby> standbys_;
};

// {"NAME": "value", ...} for "NAME=value" entries.
std::string EnvToJson(const std::vector<std::string>& env);

}  // namespace ddprun::launcher
