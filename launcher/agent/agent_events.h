#pragma once

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ddprun::launcher {

// What other threads tell the agent's thread: a stop signal arrived, the
// heartbeat says the round is over, a child changed state. The agent's thread
// sleeps in Wait between checks and wakes early on any of these. Thread-safe.
class AgentEvents {
 public:
  virtual ~AgentEvents() = default;

  void PostSignal(int sig);
  void PostRejoin();
  void PostChildEvent();

  // Returns when an event is pending or after `timeout`; clears the pending
  // child event (signals and rejoin stay until taken). The agent's only
  // sleep: lifecycle tests override it to step a fake clock instead.
  virtual void Wait(absl::Duration timeout);

  // The first stop signal received, if any.
  std::optional<int> stop_signal() const;
  // True once after the heartbeat asked for a rejoin.
  bool TakeRejoin();

 private:
  mutable absl::Mutex mu_;
  std::optional<int> stop_signal_ ABSL_GUARDED_BY(mu_);
  bool rejoin_ ABSL_GUARDED_BY(mu_) = false;
  bool child_event_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddprun::launcher
