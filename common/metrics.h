#pragma once

// A small Prometheus metrics registry: counters, gauges and histograms, each
// a family with fixed label names, rendered in the Prometheus text exposition
// format (version 0.0.4). No HTTP here; metrics_http.h serves Render().
//
//   MetricsRegistry registry;
//   CounterFamily& joins = registry.AddCounter(
//       "ddprun_rendezvous_joins_total", "Join calls answered", {"result"});
//   joins.WithLabels({"ok"}).Increment();
//   HistogramFamily& latency = registry.AddHistogram(
//       "ddprun_store_op_seconds", "Store call latency", {"op"},
//       ExponentialBuckets(0.0001, 4, 8));
//   latency.WithLabels({"get"}).Observe(0.0003);
//
// Threading: everything is safe to call from any thread. Updating a metric
// (Increment, Set, Observe) takes no registry lock; keep the reference that
// WithLabels returns on hot paths. References stay valid as long as the
// registry lives.
//
// Invariants (a metric or label name Prometheus rejects, the wrong number of
// label values, one name registered twice with another type or labels) are
// programming errors: they abort with a message naming the metric.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ddprun::common {

// A value that only goes up (events, bytes). Resets only with the process.
class Counter {
 public:
  // `by` must be >= 0; a negative amount is ignored (counters never drop).
  void Increment(double by = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (nodes alive, age of the last progress).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into buckets with fixed upper bounds (seconds, bytes).
class Histogram {
 public:
  // `upper_bounds` strictly increasing; +Inf is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Prometheus' default buckets, for latencies in seconds (5 ms .. 10 s).
std::vector<double> DefaultBuckets();
// start, start*factor, ... (count bounds); start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// One metric name with its help, type and label names; one child per
// combination of label values, created on first use.
template <typename Metric>
class Family {
 public:
  // The child for these label values (in the order of the label names).
  Metric& WithLabels(const std::vector<std::string>& values);
  // Drops every child. Only for families a collect hook fills from scratch
  // on each scrape (e.g. one gauge per job, where jobs come and go): it
  // invalidates references WithLabels returned earlier.
  void Clear();

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::vector<std::string> label_names,
         std::function<std::unique_ptr<Metric>()> make)
      : name_(std::move(name)),
        label_names_(std::move(label_names)),
        make_(std::move(make)) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<Metric>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_
      ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family, or returns the existing one of the same name, type
  // and label names. A family without labels has its single child from the
  // start, so it is scraped as 0 before the first update.
  CounterFamily& AddCounter(const std::string& name, const std::string& help,
                            const std::vector<std::string>& label_names = {});
  GaugeFamily& AddGauge(const std::string& name, const std::string& help,
                        const std::vector<std::string>& label_names = {});
  HistogramFamily& AddHistogram(const std::string& name,
                                const std::string& help,
                                const std::vector<std::string>& label_names,
                                std::vector<double> upper_bounds);

  // Runs before every Render(), e.g. to set gauges from state that is cheaper
  // to read at scrape time than to track on every change (jobs, nodes). Called
  // on the scraping thread, without registry locks held.
  void AddCollectHook(std::function<void()> hook);

  // Every family, sorted by name, in the Prometheus text format.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Entry {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> upper_bounds;  // histograms only
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };
  Entry& Register(const std::string& name, Type type, const std::string& help,
                  const std::vector<std::string>& label_names,
                  const std::vector<double>& upper_bounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

// The metric's text in the exposition format, for tests and other sinks.
// Label values are escaped (\\, \", \n); numbers print as Prometheus reads
// them (integers without exponent, +Inf, -Inf, NaN).
std::string FormatMetricValue(double value);

}  // namespace ddprun::common
