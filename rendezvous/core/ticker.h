#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ddprun::rendezvous {

struct TickerOptions {
  // Ticks come at most this often however near the deadlines, so that a
  // burst of deadlines (a job's 1,000 join timeouts) is handled in one tick.
  absl::Duration min_period = absl::Milliseconds(10);
  // And at least this often whatever the tick returned: the bound on how
  // late a deadline nobody announced (WakeBy) can fire.
  absl::Duration max_sleep = absl::Milliseconds(500);
};

// When the tick after one that started at `last_tick` runs, given the
// earliest deadline it must serve (`wanted`; InfiniteFuture: none):
// `wanted`, but no sooner than min_period and no later than max_sleep
// after `last_tick`.
absl::Time NextTickAt(absl::Time last_tick, absl::Time wanted,
                      const TickerOptions& options);

// One thread that calls `tick` until stopped: the server's only timer.
// Every deadline (join timeouts, last call, heartbeat timeouts, store
// timeouts) is checked by it, so parked calls cost no thread. `tick`
// returns the earliest time it must run again; the thread sleeps until
// then (NextTickAt), so an idle server wakes about twice a second instead
// of a hundred times (a `ddprun --standalone` agent shares the cores of
// the workers it trains with). Whoever creates a deadline earlier than
// the one `tick` last returned calls WakeBy.
//
// Times are the `clock`'s; the sleeps are the same lengths in real time
// (with a fake clock a tick still comes within max_sleep).
// Thread-safe: WakeBy from any thread, also before Start. Stop (or the
// destructor) returns after the last tick finished.
class Ticker {
 public:
  // `clock` must outlive the ticker.
  Ticker(const common::Clock* clock, TickerOptions options);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  // Starts the thread; its first tick runs at once. Call once.
  void Start(std::function<absl::Time()> tick);
  // The next tick runs by `deadline` (within the bounds of NextTickAt).
  void WakeBy(absl::Time deadline);
  void Stop();

  // Ticks run so far.
  int64_t ticks() const { return ticks_.load(); }
  // How long the thread planned to sleep after its last tick, before any
  // WakeBy; zero before the first tick.
  absl::Duration PlannedSleepForTest() const;

 private:
  void Run();
  // Stop, or a WakeBy moved the next tick since the sleep began.
  bool ShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const common::Clock* const clock_;
  const TickerOptions options_;
  std::function<absl::Time()> tick_;
  std::atomic<int64_t> ticks_{0};
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The earliest WakeBy since the running tick started.
  absl::Time requested_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The clock's time at which the last tick started, and the next is due.
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_tick_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration planned_sleep_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddprun::rendezvous
