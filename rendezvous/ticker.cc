#include "rendezvous/ticker.h"

#include <utility>

namespace ddprun::rendezvous {

Ticker::Ticker(absl::Duration period, std::function<void()> tick)
    : period_(period), tick_(std::move(tick)), thread_([this] { Run(); }) {}

Ticker::~Ticker() { Stop(); }

void Ticker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Ticker::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
      if (stop_) return;
    }
    tick_();
  }
}

}  // namespace ddprun::rendezvous
