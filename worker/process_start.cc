#include "worker/process_start.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/proc_stat.h"

namespace ddprun::worker {

double SecondsSinceProcessStart() {
  // starttime is field 22.
  std::vector<std::string> fields = common::ReadProcStatFields(getpid());
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
