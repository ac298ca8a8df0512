#include "worker/process_start.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace ddprun::worker {

double SecondsSinceProcessStart() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces; fields resume after ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // starttime is field 22; after ')' the first is field 3.
  for (int i = 3; i < 22; ++i) fields >> field;
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  struct timespec now;
  if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  double now_s = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9;
  return now_s - static_cast<double>(start_ticks) /
                     static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace ddprun::worker
