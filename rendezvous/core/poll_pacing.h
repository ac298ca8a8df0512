#pragma once

#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

struct PollPacingOptions {
  // Polls per second one job's polling nodes may send: n polling nodes poll
  // every max(min_interval, n / budget).
  int64_t budget_per_s = 25000;
  absl::Duration min_interval = absl::Milliseconds(250);
  // A polling node is dropped when it has not polled for this long at
  // least (the interval and heartbeat timeout may make it longer). Only
  // large jobs poll, and a server they saturate answers late: a short
  // timeout drops live nodes (measured at 100,000 nodes: 400,000 drops with
  // a 6 s timeout under load). A dead polling node costs at most this long
  // once it was taken into a round.
  absl::Duration min_timeout = absl::Seconds(30);
  // A waiting node is told to poll next right after the forming round's
  // expected close, not sooner, and at most this long from now: a node
  // polls while nothing can have changed for it only when the close comes
  // later than expected.
  absl::Duration max_delay = absl::Seconds(10);
};

// When the nodes that wait for a job's forming round by polling Join (Job's
// rules on polling) should poll, and when one that does not poll is gone:
// - The interval: polling nodes / budget, never under min_interval, so
//   that the polls stay within the budget's rate.
// - A node answered `waiting` polls next right after the forming round's
//   expected close, spread over one interval (each answer takes the next
//   place) so that the nodes collect their assignments at the budget's
//   rate; never sooner than min_interval, never later than max_delay.
//   Without an expected close, after one interval.
// - The close is expected at the last call's end (rule (c), once min_nodes
//   wait) or when max_nodes wait at the rate nodes have arrived for this
//   round (rule (a)), whichever comes first. Fewer than 8 arrivals, or less
//   than 50 ms of them, give no rate worth trusting.
// - A node told to poll after `interval` is dropped when silent for one
//   interval plus the heartbeat timeout a round of the waiting nodes would
//   get (ScaleHeartbeats: a server saturated by a large job's polls
//   answers late, and a live node must not be dropped for it), never under
//   three intervals nor min_timeout.
// A plain class on times it is given. Not thread-safe: its Job owns it.
class PollPacing {
 public:
  // `config`: the job's, normalized. `heartbeat_budget_per_s`: JobOptions'.
  PollPacing(PollPacingOptions options, const v1::JobConfig& config,
             int64_t heartbeat_budget_per_s);

  // A node came to wait for the forming round at `now`.
  void Arrived(absl::Time now);
  // The forming round closed or was given up: arrivals count anew.
  void RoundFormed() { arrivals_ = 0; }

  // The poll interval of `polling` polling nodes, in milliseconds (>= 1).
  int64_t IntervalMs(int64_t polling) const;
  // How long a node told to poll after `interval_ms` may stay silent while
  // `waiting` nodes wait for the round.
  absl::Duration Timeout(int64_t interval_ms, int64_t waiting) const;
  // When the forming round is expected to close, with `waiting` nodes
  // waiting and min_nodes of them since `min_reached_at` (nullopt: fewer
  // wait); nullopt without an expectation.
  std::optional<absl::Time> ExpectedClose(
      absl::Time now, std::optional<absl::Time> min_reached_at,
      int64_t waiting) const;
  // How long a node answered `waiting` at `now` waits before its next poll,
  // in milliseconds, rounded up so that a poll sent when told never comes
  // before the close. `close`: ExpectedClose's (nullopt: the interval).
  // Each call takes the next place in the spread over one interval.
  int64_t DelayMs(absl::Time now, std::optional<absl::Time> close,
                  int64_t polling);
  // The forming round's close as first told to a waiting node (to log
  // against the real close: how well the first polls were timed), and
  // forgets it; nullopt when none was told.
  std::optional<absl::Time> TakeToldClose();

 private:
  const PollPacingOptions options_;
  const int64_t heartbeat_interval_ms_;
  const int64_t heartbeat_timeout_ms_;
  const int64_t heartbeat_budget_per_s_;
  const absl::Duration last_call_timeout_;
  const int64_t max_nodes_;
  // Nodes that came to wait for the forming round since the first of them
  // (at first_arrival_): rule (a)'s arrival rate.
  int64_t arrivals_ = 0;
  absl::Time first_arrival_;
  // Counts `waiting` answers: each takes the next place in the spread.
  uint64_t places_given_ = 0;
  std::optional<absl::Time> told_close_;
};

}  // namespace ddprun::rendezvous
