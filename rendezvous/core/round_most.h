#ifndef DDPRUN_RENDEZVOUS_CORE_ROUND_MOST_H_
#define DDPRUN_RENDEZVOUS_CORE_ROUND_MOST_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace ddprun::rendezvous {

// The most that a progress figure of the running round's ranks reached, as
// their agents report it on heartbeats (HeartbeatRequest.steps, sync), and
// when the first rank got there, dated by the age its agent gave (not by a
// clock of another machine). The ranks of a round move in lockstep, so a
// rank behind the most is waited for from then: agents tell a deadlock of a
// node's only rank from it (HeartbeatResponse.round_steps, round_sync).
class RoundMost {
 public:
  // A node's figure, reached `age_ms` before `now`; 0 or less: none yet.
  void Take(int64_t value, int64_t age_ms, absl::Time now) {
    if (value <= 0 || value < value_) return;
    const absl::Time reached =
        now - absl::Milliseconds(std::max<int64_t>(0, age_ms));
    // The first rank there: it has waited longest.
    if (value > value_ || reached < reached_) reached_ = reached;
    value_ = value;
  }
  // A new round: nothing reached yet.
  void Reset() { value_ = 0; }

  int64_t value() const { return value_; }
  // How long ago the first rank got to value() (0 when none did).
  int64_t AgeMs(absl::Time now) const {
    if (value_ <= 0) return 0;
    return std::max<int64_t>(0, absl::ToInt64Milliseconds(now - reached_));
  }

 private:
  int64_t value_ = 0;
  absl::Time reached_;
};

}  // namespace ddprun::rendezvous

#endif  // DDPRUN_RENDEZVOUS_CORE_ROUND_MOST_H_
