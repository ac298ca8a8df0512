#include "launcher/posix/signal_watcher.h"

#include <signal.h>
#include <time.h>

namespace ddprun::launcher {
namespace {

sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  // As torchrun: these end the job, forwarded to every worker first
  // (SIGUSR1/SIGUSR2 too, which schedulers send ahead of a preemption).
  for (int sig :
       {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) {
    sigaddset(&set, sig);
  }
  return set;
}

}  // namespace

void SignalWatcher::BlockSignals() {
  sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A worker's closed progress pipe or console must not kill the agent.
  signal(SIGPIPE, SIG_IGN);
}

SignalWatcher::SignalWatcher(Callbacks callbacks)
    : callbacks_(std::move(callbacks)), thread_([this] { Run(); }) {}

SignalWatcher::~SignalWatcher() {
  stop_ = true;
  thread_.join();
}

void SignalWatcher::Run() {
  sigset_t set = WatchedSignals();
  // The timeout only bounds how long destruction waits.
  timespec timeout{0, 50 * 1000 * 1000};
  while (!stop_) {
    int sig = sigtimedwait(&set, nullptr, &timeout);
    if (sig < 0) continue;
    if (sig == SIGCHLD) {
      if (callbacks_.on_child) callbacks_.on_child();
    } else if (callbacks_.on_stop_signal) {
      callbacks_.on_stop_signal(sig);
    }
  }
}

}  // namespace ddprun::launcher
