#include "launcher/agent/rank_figures.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ddprun::launcher {

RankFigures::RankFigures(int num_ranks, absl::Time round_start,
                         RankFiguresOptions options)
    : options_(options), round_start_(round_start), ranks_(num_ranks) {}

void RankFigures::OnRecord(int local_rank, const common::ProgressRecord& record,
                           absl::Time now) {
  using Kind = common::ProgressRecord::Kind;
  if (record.kind != Kind::kStep && record.kind != Kind::kPhase &&
      record.kind != Kind::kCollective) {
    return;
  }
  absl::MutexLock lock(&mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[local_rank];
  if (record.kind == Kind::kCollective) {
    if (r.in_sync) {
      ++r.sync;
      r.synced = now;
    }
    return;
  }
  if (record.kind == Kind::kPhase) {
    // The sync's collectives count from its record; leaving it is one
    // more. A join starts a round again.
    if (record.phase == common::Phase::kSync) {
      r.in_sync = true;
      r.sync = 0;
    } else if (r.in_sync) {
      r.in_sync = false;
      ++r.sync;
      r.synced = now;
    }
    if (record.phase == common::Phase::kJoin) r.sync = 0;
    if (record.phase == common::Phase::kJoin ||
        record.phase == common::Phase::kSync ||
        record.phase == common::Phase::kFirstStep) {
      r.steps = 0;
    }
    return;
  }
  ++r.steps;
  r.stepped = now;
  r.samples.push_back({now, record.compute_seconds.value_or(-1)});
  while (
      static_cast<int>(r.samples.size()) > options_.max_samples ||
      (!r.samples.empty() && r.samples.front().time < now - options_.window)) {
    r.samples.pop_front();
  }
}

void RankFigures::SetPhase(int local_rank, common::Phase phase) {
  absl::MutexLock lock(&mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[local_rank];
  if (!r.exited) r.phase = std::string(common::PhaseName(phase));
}

void RankFigures::SetExited(int local_rank) {
  absl::MutexLock lock(&mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  ranks_[local_rank].exited = true;
  ranks_[local_rank].phase = "exited";
}

RankFigures::Most RankFigures::MostOf(int64_t Rank::*value,
                                      absl::Time Rank::*reached) const {
  absl::MutexLock lock(&mu_);
  Most most;
  for (const Rank& r : ranks_) {
    const int64_t v = r.*value;
    if (v > most.value ||
        (v == most.value && v > 0 && r.*reached < most.reached)) {
      most = {v, r.*reached};
    }
  }
  return most;
}

RankFigures::Most RankFigures::MostSteps() const {
  return MostOf(&Rank::steps, &Rank::stepped);
}

RankFigures::Most RankFigures::MostSync() const {
  return MostOf(&Rank::sync, &Rank::synced);
}

std::vector<v1::RankFigures> RankFigures::Summary(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::RankFigures> out;
  out.reserve(ranks_.size());
  const absl::Time from = now - options_.window;
  // A round younger than the window: the rate over its age.
  const double span_s = absl::ToDoubleSeconds(std::min(
      options_.window, std::max(now - round_start_, absl::Milliseconds(100))));
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const Rank& r = ranks_[i];
    v1::RankFigures& f = out.emplace_back();
    f.set_local_rank(i);
    f.set_phase(r.phase);
    f.set_steps(r.steps);
    std::vector<double> compute;
    int64_t in_window = 0;
    for (const Sample& s : r.samples) {
      if (s.time < from) continue;
      ++in_window;
      if (s.compute_s >= 0) compute.push_back(s.compute_s);
    }
    f.set_steps_per_s(static_cast<double>(in_window) / span_s);
    if (compute.empty()) continue;
    std::sort(compute.begin(), compute.end());
    const size_t n = compute.size();
    f.set_samples(static_cast<int>(n));
    f.set_compute_mean_s(std::accumulate(compute.begin(), compute.end(), 0.0) /
                         static_cast<double>(n));
    f.set_compute_median_s(n % 2 == 1
                               ? compute[n / 2]
                               : (compute[n / 2 - 1] + compute[n / 2]) / 2);
    const size_t p99 =
        static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
    f.set_compute_p99_s(compute[std::max<size_t>(p99, 1) - 1]);
  }
  return out;
}

}  // namespace ddprun::launcher
