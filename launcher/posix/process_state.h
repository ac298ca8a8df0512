#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ddprun::launcher {

// What /proc says of a process at one look: its main thread's state and
// the CPU time of all its threads (/proc/PID/stat); where asked for, the
// I/O of all its threads and whether it has a child process.
struct ProcessState {
  // proc(5)'s letter: R running, S asleep waiting for an event, D in
  // uninterruptible (disk) sleep, T stopped, t held by a debugger, Z ended.
  char state = '?';
  absl::Duration cpu;  // user + system, every thread
  // Bytes it moved, every thread: read and written by system calls (files,
  // pipes, sockets) and fetched from or sent to storage (page faults,
  // writeback): /proc/PID/io's rchar + wchar + read_bytes + write_bytes.
  // Only whether it changes between two looks means anything. nullopt: not
  // read, or unreadable.
  std::optional<uint64_t> io;
  // Whether one of its threads has a child process that has not been
  // waited for (/proc/PID/task/*/children); while the main thread does not
  // sleep (state S), only the main thread's children are looked for: only a
  // sleeping worker can be quiet. nullopt: not read, or unreadable.
  std::optional<bool> has_children;

  bool stopped() const { return state == 'T'; }
  bool sleeping() const { return state == 'S'; }
};

// Parses the text of /proc/PID/stat; `ticks_per_second` is
// sysconf(_SC_CLK_TCK). nullopt when the text is not one.
std::optional<ProcessState> ParseProcessStat(absl::string_view text,
                                             long ticks_per_second);

// Parses the text of /proc/PID/io into ProcessState::io; nullopt when a
// field is missing.
std::optional<uint64_t> ParseProcessIo(absl::string_view text);

// Reads /proc/PID/stat; nullopt when the process is gone or it is
// unreadable.
std::optional<ProcessState> ReadProcessState(pid_t pid);

// ReadProcessState, with ProcessState::io and has_children too: more small
// reads of /proc (one per thread for the children), for the agent's looks
// at its workers.
std::optional<ProcessState> ReadProcessActivity(pid_t pid);

}  // namespace ddprun::launcher
