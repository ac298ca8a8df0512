#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddprun::testing {

struct SubprocessOptions {
  std::vector<std::string> argv;
  // Added to (or replacing in) the test's own environment.
  std::map<std::string, std::string> env;
  // Names removed from the environment.
  std::vector<std::string> unset_env;
  // stdout and stderr go to these files (created); empty: /dev/null.
  std::string stdout_path;
  std::string stderr_path;
};

// How a process ended.
struct ExitInfo {
  int exit_code = -1;  // -1 when signaled
  int signal = 0;      // 0 when it exited
  bool ok() const { return signal == 0 && exit_code == 0; }
  std::string ToString() const;
};

// A real child process for integration tests, in its own process group.
// The destructor kills the group (SIGKILL) and reaps the child, so a failing
// test leaves nothing running. Not thread-safe.
class Subprocess {
 public:
  static absl::StatusOr<Subprocess> Start(const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the child to end; nullopt when it is still
  // running then.
  std::optional<ExitInfo> Wait(absl::Duration timeout);
  // Non-blocking check.
  std::optional<ExitInfo> Poll();
  // Sends `sig` to the child's process group.
  void SignalGroup(int sig);
  // Sends `sig` to the child only.
  void Signal(int sig);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  void KillAndReap();

  pid_t pid_ = -1;
  std::optional<ExitInfo> exit_;
};

// Runs a command to completion (bounded); the convenience most tests need.
struct RunResult {
  ExitInfo exit;
  bool timed_out = false;
  std::string out;
  std::string err;
};
RunResult RunCommand(const std::vector<std::string>& argv,
                     absl::Duration timeout,
                     const std::map<std::string, std::string>& env = {});

// True when `pid` names no live process (a zombie counts as gone).
bool ProcessGone(pid_t pid);

// The direct children of `pid` (an agent's workers), in ascending order,
// from /proc/<pid>/task/*/children; empty when `pid` is gone.
std::vector<pid_t> Children(pid_t pid);

// The children of agent `pid` that are workers: Children less the
// prewarming's processes, which name themselves "ddprun-zygote" and,
// until activated, "ddprun-standby" (ddprun prewarms libddp programs by
// default).
std::vector<pid_t> Workers(pid_t pid);

// RANK from the initial environment of process `pid` (/proc/<pid>/environ):
// set for workers an agent started afresh, absent (-1) for a standby.
int RankOf(pid_t pid);
// The same, or for an activated standby (whose initial environment has no
// RANK), the rank its activation line in `log` names ("prewarmed process
// PID activated as rank R", ddprun-mnist's and libddp's standby log).
int RankOf(pid_t pid, const std::string& log);

// How many lines of `text` (a log) contain `needle`.
int CountLinesWith(const std::string& text, const std::string& needle);

}  // namespace ddprun::testing
