#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ddprun::common {

// The fields of a /proc/PID/stat text (proc(5)) after the command name,
// which may hold spaces and ')' and so ends at the last ')': [0] is the
// state (proc(5)'s field 3), and field N of proc(5) is [N - 3]. Empty when
// the text is not one.
std::vector<std::string> ProcStatFields(absl::string_view text);

// ProcStatFields of /proc/PID/stat now; empty when the process is gone.
std::vector<std::string> ReadProcStatFields(pid_t pid);

}  // namespace ddprun::common
