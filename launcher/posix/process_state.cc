#include "launcher/posix/process_state.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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

std::optional<ProcessState> ReadProcessState(pid_t pid) {
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  if (!stat) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(stat)),
                         std::istreambuf_iterator<char>());
  return ParseProcessStat(text, sysconf(_SC_CLK_TCK));
}

}  // namespace ddprun::launcher
