#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace ddprun::rendezvous {

struct StragglerOptions {
  // A rank is slow in a window when its compute time per step is above
  // this many times the median of the other ranks' (ddprun-rendezvous
  // --straggler-factor). 0: stragglers are never named.
  double factor = 1.5;
  // Named after this many slow windows in a row, cleared after as many
  // windows not slow (--straggler-windows): one slow window (a checkpoint,
  // a garbage collection, a neighbour's burst) names nobody.
  int windows = 3;
  // How often the ranks are compared: one window.
  absl::Duration window = absl::Seconds(1);
  // A rank's figures count only with this many step records behind them
  // (fewer: too little to judge; the rank is left out of the window).
  int min_samples = 3;
  // Figures older than this are stale (the node stopped sending them) and
  // left out.
  absl::Duration max_age = absl::Seconds(5);
  // At most this many stragglers are reported (slowest first), so that a
  // job gone wholly wrong does not flood status, metrics and the page.
  int max_reported = 16;
};

// One rank's latest figures.
struct RankSample {
  std::string node_id;
  int local_rank = 0;
  int samples = 0;
  // Mean compute time per step over the agent's window. The mean, not the
  // median: a rank throttled in bursts (a cgroup's CPU quota, a stop and
  // continue duty cycle, a noisy neighbour) computes most steps at full
  // speed and a few very slowly; its median hides that, while its mean is
  // what it costs the job.
  double compute_s = 0;
};

// Names the ranks of one job whose own compute time stays above the
// others' median. A plain class: time comes in as `now`; no gRPC, no
// threads (Job owns it, under JobTable's mutex).
//
// The rules:
// - Report() keeps each rank's latest figures. Evaluate() compares them
//   once per window (sooner calls do nothing): the ranks with fresh figures
//   (max_age) and enough samples (min_samples) each get compared with the
//   median of the other such ranks. The other ranks, not all: with two
//   ranks, a rank twice as slow as its peer is only 1.33 times their common
//   median.
// - A rank slow in `windows` windows in a row is named a straggler; a
//   named rank not slow (or without figures) in `windows` windows in a row
//   is cleared. Evaluate returns the changes, for the event log.
// - Reset() (a new round: ranks move) forgets everything.
class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions options = {});

  void Report(int rank, const RankSample& sample, absl::Time now);

  struct Straggler {
    int rank = 0;
    RankSample sample;
    double job_median_s = 0;
    double ratio = 0;
    absl::Time since;
  };
  struct Change {
    bool named = false;  // false: cleared
    Straggler straggler;
  };
  std::vector<Change> Evaluate(absl::Time now);
  // Named now, slowest (highest ratio) first, at most max_reported. Kept
  // from the last Evaluate: reading it costs no scan of the ranks (a
  // heartbeat reads it).
  const std::vector<Straggler>& stragglers() const { return named_; }
  // The median compute time per step across ranks at the last window; 0
  // before one had figures.
  double job_median_s() const { return job_median_s_; }
  void Reset();
  // How often nodes send their figures (the round's figures interval):
  // figures stay fresh for 2.5 intervals, and at least max_age, so that a
  // large job's longer interval does not leave every rank stale.
  void SetReportInterval(absl::Duration interval);
  absl::Duration max_age() const { return max_age_; }

 private:
  struct Rank {
    RankSample sample;
    absl::Time reported;
    int slow_windows = 0;
    int fine_windows = 0;
    std::optional<Straggler> named;  // set while it is a straggler
  };

  StragglerOptions options_;
  absl::Duration max_age_;
  absl::flat_hash_map<int, Rank> ranks_;
  absl::Time next_window_ = absl::InfinitePast();
  double job_median_s_ = 0;
  std::vector<Straggler> named_;
};

}  // namespace ddprun::rendezvous
