#include "rendezvous/core/job_events.h"

#include <algorithm>
#include <utility>

namespace ddprun::rendezvous {

JobEvents::JobEvents(int max_events, int keep_first)
    : max_events_(std::max(1, max_events)),
      keep_first_(std::clamp(keep_first, 0, std::max(0, max_events - 1))) {}

void JobEvents::Add(absl::Time now, std::string kind, int64_t round, int rank,
                    std::string message) {
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(now));
  event.set_kind(std::move(kind));
  event.set_round(round);
  event.set_rank(rank);
  event.set_message(std::move(message));
  if (static_cast<int>(events_.size()) >= max_events_) {
    events_.erase(events_.begin() + keep_first_);
    ++dropped_;
  }
  events_.push_back(std::move(event));
}

}  // namespace ddprun::rendezvous
