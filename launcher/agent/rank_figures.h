#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/progress_record.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

struct RankFiguresOptions {
  // Figures summarise the step records of this last stretch of time: long
  // enough for a few dozen steps, short enough that a straggler shows
  // within seconds.
  absl::Duration window = absl::Seconds(2);
  // Records kept per rank within the window (the oldest go first).
  int max_samples = 1024;
};

// One round's local ranks as the heartbeats report them (v1::RankFigures):
// phase, steps, step rate and compute time per step (mean, median, p99)
// over the window. Thread-safe: the agent's thread records what its
// workers report, the heartbeat thread takes the summary.
class RankFigures {
 public:
  RankFigures(int num_ranks, absl::Time round_start,
              RankFiguresOptions options = {});

  void OnRecord(int local_rank, const common::ProgressRecord& record,
                absl::Time now);
  // The phase the supervisor sees the rank in.
  void SetPhase(int local_rank, common::Phase phase);
  // The worker ended: its phase reads "exited" from now on.
  void SetExited(int local_rank);

  std::vector<v1::RankFigures> Summary(absl::Time now) const;
  // The most of a figure any local rank reached in the round, and when the
  // first rank got there; value 0: none yet.
  struct Most {
    int64_t value = 0;
    absl::Time reached;
  };
  // The most steps a local rank completed in the round, dated by its last
  // step record (HeartbeatRequest.steps, steps_age_ms).
  Most MostSteps() const;
  // How far a local rank got through the round's state sync: the sync's
  // collectives it entered, one more once it left the sync
  // (HeartbeatRequest.sync, sync_age_ms). Counted only from the rank's sync
  // record of this round: a survivor's records of the round before, read
  // at this one's start, do not count.
  Most MostSync() const;

 private:
  struct Sample {
    absl::Time time;
    double compute_s = -1;  // negative: the record carried none
  };
  struct Rank {
    std::string phase = "start";
    bool exited = false;
    // Steps since it began stepping in the round (its "phase step"), as the
    // supervisor counts them: a survivor's step record of the round before,
    // read at this round's start, does not count.
    int64_t steps = 0;
    absl::Time stepped;  // when its last step record came
    // In the round's state sync (its sync record came), how far it got
    // (MostSync), and since when.
    bool in_sync = false;
    int64_t sync = 0;
    absl::Time synced;
    std::deque<Sample> samples;
  };

  Most MostOf(int64_t Rank::*value, absl::Time Rank::*reached) const;

  const RankFiguresOptions options_;
  const absl::Time round_start_;
  mutable absl::Mutex mu_;
  std::vector<Rank> ranks_ ABSL_GUARDED_BY(mu_);
};

// The round's most steps and its furthest in the state sync, and since when
// a rank has been there, as the server last answered them, handed from the
// heartbeat thread (Post) to the agent's (Take). Thread-safe.
class RoundProgressInbox {
 public:
  struct Latest {
    int64_t steps = 0;
    absl::Time steps_since;
    int64_t sync = 0;
    absl::Time sync_since;
  };
  void Post(Latest latest) {
    absl::MutexLock lock(&mu_);
    latest_ = latest;
  }
  // The latest answer since the last Take; nullopt: none came.
  std::optional<Latest> Take() {
    absl::MutexLock lock(&mu_);
    std::optional<Latest> out;
    out.swap(latest_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::optional<Latest> latest_ ABSL_GUARDED_BY(mu_);
};

// The local ranks the server names stragglers, handed from the heartbeat
// thread (Post) to the agent's (Take). Thread-safe.
class StragglerInbox {
 public:
  void Post(std::vector<int> local_ranks) {
    absl::MutexLock lock(&mu_);
    for (int r : local_ranks) ranks_.push_back(r);
  }
  std::vector<int> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<int> out;
    out.swap(ranks_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<int> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddprun::launcher
