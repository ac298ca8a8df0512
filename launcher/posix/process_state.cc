#include "launcher/posix/process_state.h"

#include <unistd.h>

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
  if (std::optional<std::string> children = ReadProcFile(
          absl::StrFormat("/proc/%d/task/%d/children", pid, pid))) {
    state->has_children = !absl::StripAsciiWhitespace(*children).empty();
  }
  return state;
}

}  // namespace ddprun::launcher
