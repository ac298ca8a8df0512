#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

// A job's event log: rounds, failures with their cause, in-place
// recoveries, restarts, stragglers, the end. Bounded: past `max_events`
// the oldest go (the first `keep_first` stay, so the job's start and its
// first failure, usually the root cause, survive a long noisy run). Kept
// with its Job, which JobTable keeps for ended_job_grace after the end.
// Not thread-safe (Job's).
class JobEvents {
 public:
  explicit JobEvents(int max_events = 512, int keep_first = 32);

  void Add(absl::Time now, std::string kind, int64_t round, int rank,
           std::string message);
  // Oldest first. `dropped()` events fell out between the kept first ones
  // and the rest.
  const std::deque<v1::JobEvent>& events() const { return events_; }
  int64_t dropped() const { return dropped_; }

 private:
  const int max_events_;
  const int keep_first_;
  std::deque<v1::JobEvent> events_;
  int64_t dropped_ = 0;
};

}  // namespace ddprun::rendezvous
