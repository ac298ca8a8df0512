#include "worker/broken_pipes.h"

#include <signal.h>

namespace ddprun::worker {

void IgnoreBrokenPipes() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace ddprun::worker
