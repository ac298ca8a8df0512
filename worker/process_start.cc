#include "worker/process_start.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ddprun::worker {

std::vector<std::string> SelfStatFields() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return {};
  return absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
}

double SecondsSinceProcessStart() {
  // starttime is field 22.
  std::vector<std::string> fields = SelfStatFields();
  unsigned long long start_ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[22 - 3], &start_ticks)) {
    return -1;
  }
  struct timespec now;
  if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  double now_s = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9;
  return now_s - static_cast<double>(start_ticks) /
                     static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace ddprun::worker
