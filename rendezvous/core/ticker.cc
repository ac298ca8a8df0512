#include "rendezvous/core/ticker.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace ddprun::rendezvous {

absl::Time NextTickAt(absl::Time last_tick, absl::Time wanted,
                      const TickerOptions& options) {
  const absl::Duration max_sleep =
      std::max(options.max_sleep, options.min_period);
  return std::clamp(wanted, last_tick + options.min_period,
                    last_tick + max_sleep);
}

Ticker::Ticker(const common::Clock* clock, TickerOptions options)
    : clock_(clock), options_(options) {}

Ticker::~Ticker() { Stop(); }

void Ticker::Start(std::function<absl::Time()> tick) {
  tick_ = std::move(tick);
  thread_ = std::thread([this] { Run(); });
}

void Ticker::WakeBy(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  requested_ = std::min(requested_, deadline);
  // While a tick runs, last_tick_ is its start: the next tick is planned
  // from requested_ when it ends.
  next_tick_ = std::min(next_tick_, NextTickAt(last_tick_, deadline, options_));
}

void Ticker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Duration Ticker::PlannedSleepForTest() const {
  absl::MutexLock lock(&mu_);
  return planned_sleep_;
}

bool Ticker::ShouldWake() const {
  return stop_ || next_tick_ != sleeping_until_;
}

void Ticker::Run() {
  while (true) {
    const absl::Time started = clock_->Now();
    const absl::Time real_start = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      last_tick_ = started;
      requested_ = absl::InfiniteFuture();
    }
    const absl::Time wanted = tick_();
    ticks_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    next_tick_ = NextTickAt(started, std::min(wanted, requested_), options_);
    planned_sleep_ = next_tick_ - started;
    // Sleeps are measured in real time (the clock may be a fake one that
    // does not move); a WakeBy shortens the sleep under way.
    while (!stop_) {
      const absl::Duration left =
          (next_tick_ - started) - (absl::Now() - real_start);
      if (left <= absl::ZeroDuration()) break;
      sleeping_until_ = next_tick_;
      mu_.AwaitWithTimeout(absl::Condition(this, &Ticker::ShouldWake), left);
    }
  }
}

}  // namespace ddprun::rendezvous
