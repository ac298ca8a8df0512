#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ddprun::rendezvous {

// One thread that calls `tick` every `period` until stopped: the server's
// only timer. Every deadline (join timeouts, last call, heartbeat timeouts,
// store timeouts) is checked by it, so parked calls cost no thread.
// Stop (or the destructor) returns after the last tick finished.
class Ticker {
 public:
  Ticker(absl::Duration period, std::function<void()> tick);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  void Stop();

 private:
  void Run();

  const absl::Duration period_;
  const std::function<void()> tick_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddprun::rendezvous
