#pragma once

#include <string>

namespace ddprun::launcher {

// How a process ended, decoded from a wait status.
struct ExitStatus {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // 0 when it exited
  bool core_dumped = false;

  static ExitStatus FromWaitStatus(int wait_status);
  static ExitStatus Exited(int code) { return {code, 0, false}; }
  static ExitStatus Signaled(int sig) { return {-1, sig, false}; }

  bool success() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "signal SIGKILL (9)" (", core dumped").
  std::string ToString() const;
};

// "SIGSEGV" for 11; "signal 77" for a number without a name.
std::string SignalName(int sig);

}  // namespace ddprun::launcher
