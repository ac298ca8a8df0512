#include "launcher/posix/process_state.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/proc_stat.h"

namespace ddprun::launcher {

std::optional<ProcessState> ParseProcessStat(absl::string_view text,
                                             long ticks_per_second) {
  // [0] is the state; utime and stime are proc(5)'s fields 14 and 15.
  const std::vector<std::string> fields = common::ProcStatFields(text);
  int64_t utime = 0;
  int64_t stime = 0;
  if (ticks_per_second <= 0 || fields.size() < 13 || fields[0].size() != 1 ||
      !absl::SimpleAtoi(fields[14 - 3], &utime) ||
      !absl::SimpleAtoi(fields[15 - 3], &stime)) {
    return std::nullopt;
  }
  ProcessState state;
  state.state = fields[0][0];
  state.cpu = absl::Seconds(static_cast<double>(utime + stime) /
                            static_cast<double>(ticks_per_second));
  return state;
}

std::optional<uint64_t> ParseProcessIo(absl::string_view text) {
  // Lines of "name: value"; the sum of the four that count bytes moved.
  constexpr absl::string_view kFields[] = {"rchar", "wchar", "read_bytes",
                                           "write_bytes"};
  uint64_t sum = 0;
  int found = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> field =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    for (absl::string_view name : kFields) {
      uint64_t value = 0;
      if (field.first == name &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(field.second), &value)) {
        sum += value;
        ++found;
      }
    }
  }
  if (found != static_cast<int>(std::size(kFields))) return std::nullopt;
  return sum;
}

namespace {

// The whole of a small /proc file; nullopt when it cannot be opened.
std::optional<std::string> ReadProcFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(file)),
                     std::istreambuf_iterator<char>());
}

// Whether a thread of `pid` has a child: its main thread, or with
// `every_thread` any: each thread's children are listed under it alone
// (/proc/PID/task/TID/children), and a program's helper thread that runs a
// command (a checkpoint's upload) is not its main thread. A thread that
// ends while this reads is skipped. nullopt when the main thread's list or
// the threads cannot be read (a kernel without CONFIG_PROC_CHILDREN has no
// such lists).
std::optional<bool> HasChildren(pid_t pid, bool every_thread) {
  std::optional<std::string> main_children =
      ReadProcFile(absl::StrFormat("/proc/%d/task/%d/children", pid, pid));
  if (!main_children) return std::nullopt;
  if (!absl::StripAsciiWhitespace(*main_children).empty()) return true;
  if (!every_thread) return false;
  std::error_code error;
  std::filesystem::directory_iterator tasks(
      absl::StrFormat("/proc/%d/task", pid), error);
  if (error) return std::nullopt;
  // increment(error), not a range-for: the process may end while this
  // reads, and the agent's look must not throw.
  const std::string main_thread = std::to_string(pid);
  for (; !error && tasks != std::filesystem::directory_iterator();
       tasks.increment(error)) {
    if (tasks->path().filename() == main_thread) continue;  // read above
    std::optional<std::string> children =
        ReadProcFile(tasks->path().string() + "/children");
    if (children && !absl::StripAsciiWhitespace(*children).empty()) {
      return true;
    }
  }
  if (error) return std::nullopt;
  return false;
}

}  // namespace

std::optional<ProcessState> ReadProcessState(pid_t pid) {
  const std::optional<std::string> text =
      ReadProcFile(absl::StrFormat("/proc/%d/stat", pid));
  if (!text) return std::nullopt;
  return ParseProcessStat(*text, sysconf(_SC_CLK_TCK));
}

std::optional<ProcessState> ReadProcessActivity(pid_t pid) {
  std::optional<ProcessState> state = ReadProcessState(pid);
  if (!state) return std::nullopt;
  if (std::optional<std::string> io =
          ReadProcFile(absl::StrFormat("/proc/%d/io", pid))) {
    state->io = ParseProcessIo(*io);
  }
  // A file per thread, read only where the answer is used: a quiet worker
  // sleeps (ProcessState::has_children).
  state->has_children = HasChildren(pid, state->sleeping());
  return state;
}

}  // namespace ddprun::launcher
