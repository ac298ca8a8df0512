#include "rendezvous/core/straggler_detector.h"

#include <algorithm>
#include <utility>

namespace ddprun::rendezvous {
namespace {

// The median of sorted `v` without the element at `skip` (-1: none).
double MedianWithout(const std::vector<double>& v, int skip) {
  const int n = static_cast<int>(v.size()) - (skip >= 0 ? 1 : 0);
  if (n <= 0) return 0;
  auto at = [&](int i) { return v[skip >= 0 && i >= skip ? i + 1 : i]; };
  return n % 2 == 1 ? at(n / 2) : (at(n / 2 - 1) + at(n / 2)) / 2;
}

}  // namespace

StragglerDetector::StragglerDetector(StragglerOptions options)
    : options_(options), max_age_(options.max_age) {}

void StragglerDetector::Report(int rank, const RankSample& sample,
                               absl::Time now) {
  Rank& r = ranks_[rank];
  r.sample = sample;
  r.reported = now;
}

void StragglerDetector::SetReportInterval(absl::Duration interval) {
  max_age_ = std::max(options_.max_age, interval * 2.5);
}

void StragglerDetector::Reset() {
  ranks_.clear();
  job_median_s_ = 0;
  named_.clear();
}

std::vector<StragglerDetector::Change> StragglerDetector::Evaluate(
    absl::Time now) {
  std::vector<Change> changes;
  if (options_.factor <= 0 || now < next_window_) return changes;
  next_window_ = now + options_.window;

  // The ranks that count in this window, and their figures sorted.
  std::vector<std::pair<double, int>> counted;
  for (const auto& [rank, r] : ranks_) {
    if (now - r.reported <= max_age_ &&
        r.sample.samples >= options_.min_samples) {
      counted.push_back({r.sample.compute_s, rank});
    }
  }
  std::sort(counted.begin(), counted.end());
  std::vector<double> sorted;
  sorted.reserve(counted.size());
  for (const auto& c : counted) sorted.push_back(c.first);
  job_median_s_ = MedianWithout(sorted, -1);

  absl::flat_hash_map<int, std::pair<double, double>> slow;  // median, ratio
  if (counted.size() >= 2) {
    for (int i = 0; i < static_cast<int>(counted.size()); ++i) {
      const double median = MedianWithout(sorted, i);
      if (median > 0 && counted[i].first > options_.factor * median) {
        slow[counted[i].second] = {median, counted[i].first / median};
      }
    }
  }
  for (auto& [rank, r] : ranks_) {
    auto it = slow.find(rank);
    if (it != slow.end()) {
      ++r.slow_windows;
      r.fine_windows = 0;
      if (r.named.has_value()) {
        r.named->sample = r.sample;
        r.named->job_median_s = it->second.first;
        r.named->ratio = it->second.second;
      } else if (r.slow_windows >= options_.windows) {
        r.named =
            Straggler{rank, r.sample, it->second.first, it->second.second, now};
        changes.push_back({true, *r.named});
      }
    } else {
      ++r.fine_windows;
      r.slow_windows = 0;
      if (r.named.has_value() && r.fine_windows >= options_.windows) {
        changes.push_back({false, *r.named});
        r.named.reset();
      }
    }
  }
  named_.clear();
  for (const auto& [rank, r] : ranks_) {
    if (r.named.has_value()) named_.push_back(*r.named);
  }
  std::sort(named_.begin(), named_.end(),
            [](const Straggler& a, const Straggler& b) {
              return a.ratio != b.ratio ? a.ratio > b.ratio : a.rank < b.rank;
            });
  if (static_cast<int>(named_.size()) > options_.max_reported) {
    named_.resize(options_.max_reported);
  }
  return changes;
}

}  // namespace ddprun::rendezvous
