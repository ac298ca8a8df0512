#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace ddprun::launcher {

// Takes SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD on a thread of its own
// (sigtimedwait), so that no handler runs inside gRPC or the allocator.
// BlockSignals() must run in main before any other thread exists, so that
// every thread inherits the mask; workers reset it before exec.
class SignalWatcher {
 public:
  struct Callbacks {
    std::function<void(int sig)> on_stop_signal;  // first and later ones
    std::function<void()> on_child;
  };

  static void BlockSignals();

  explicit SignalWatcher(Callbacks callbacks);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  void Run();

  Callbacks callbacks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ddprun::launcher
