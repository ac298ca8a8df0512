#pragma once

#include <sys/types.h>

#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ddprun::launcher {

// What /proc/PID/stat says of a process at one look: its main thread's
// state and the CPU time of all its threads.
struct ProcessState {
  // proc(5)'s letter: R running, S asleep waiting for an event, D in
  // uninterruptible (disk) sleep, T stopped, t held by a debugger, Z ended.
  char state = '?';
  absl::Duration cpu;  // user + system, every thread

  bool stopped() const { return state == 'T'; }
  bool sleeping() const { return state == 'S'; }
};

// Parses the text of /proc/PID/stat; `ticks_per_second` is
// sysconf(_SC_CLK_TCK). nullopt when the text is not one.
std::optional<ProcessState> ParseProcessStat(absl::string_view text,
                                             long ticks_per_second);

// Reads /proc/PID/stat; nullopt when the process is gone or it is
// unreadable.
std::optional<ProcessState> ReadProcessState(pid_t pid);

}  // namespace ddprun::launcher
