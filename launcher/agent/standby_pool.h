#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
// the worker. Owned and used by the agent's thread (it forks).
class StandbyPool {
 public:
  // `argv` runs a standby; `env` is its environment before activation.
  StandbyPool(ProcessControl& control, std::vector<std::string> argv,
              std::vector<std::string> env);
  // Kills the standbys still waiting.
  ~StandbyPool();
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  // Makes `count` standbys wait (starting the missing ones). A standby that
  // cannot be started is logged and left out.
  void Fill(int count);
  int size() const { return static_cast<int>(standbys_.size()); }
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

 private:
  struct Standby {
    pid_t pid = -1;
    int control_fd = -1;  // write end; the standby reads the other
    ProgressChannel progress;
    ControlChannel control;  // the rounds after activation
  };

  ProcessControl& control_;
  std::vector<std::string> argv_;
  std::vector<std::string> env_;
  std::vector<Standby> standbys_;
};

// {"NAME": "value", ...} for "NAME=value" entries.
std::string EnvToJson(const std::vector<std::string>& env);

}  // namespace ddprun::launcher
