#include "launcher/agent/agent_events.h"

namespace ddprun::launcher {

void AgentEvents::PostSignal(int sig) {
  absl::MutexLock lock(&mu_);
  if (!stop_signal_) stop_signal_ = sig;
}

void AgentEvents::PostRejoin() {
  absl::MutexLock lock(&mu_);
  rejoin_ = true;
}

void AgentEvents::PostChildEvent() {
  absl::MutexLock lock(&mu_);
  child_event_ = true;
}

void AgentEvents::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_signal_.has_value() || rejoin_ || child_event_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&pending), timeout);
  child_event_ = false;
}

std::optional<int> AgentEvents::stop_signal() const {
  absl::MutexLock lock(&mu_);
  return stop_signal_;
}

bool AgentEvents::TakeRejoin() {
  absl::MutexLock lock(&mu_);
  bool r = rejoin_;
  rejoin_ = false;
  return r;
}

}  // namespace ddprun::launcher
