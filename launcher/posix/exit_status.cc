#include "launcher/posix/exit_status.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"

namespace ddprun::launcher {

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  ExitStatus status;
  if (WIFEXITED(wait_status)) {
    status.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    status.signal = WTERMSIG(wait_status);
    status.core_dumped = WCOREDUMP(wait_status);
  }
  return status;
}

std::string ExitStatus::ToString() const {
  if (signal == 0) return absl::StrCat("exit code ", exit_code);
  return absl::StrCat("signal ", SignalName(signal), " (", signal, ")",
                      core_dumped ? ", core dumped" : "");
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return absl::StrCat("signal ", sig);
  return absl::StrCat("SIG", abbrev);
}

}  // namespace ddprun::launcher
