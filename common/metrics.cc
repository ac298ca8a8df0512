#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ddprun::common {
namespace {

// A broken invariant: the program registers or uses a metric wrongly.
[[noreturn]] void DieBadMetric(const std::string& message) {
  std::fprintf(stderr, "ddprun metrics: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void AddToAtomic(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta,
                                       std::memory_order_relaxed)) {
  }
}

bool ValidMetricName(const std::string& name) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  return std::regex_match(name, kName);
}

bool ValidLabelName(const std::string& name) {
  static const std::regex kLabel("[a-zA-Z_][a-zA-Z0-9_]*");
  // "__" names are Prometheus' own; "le" is the histogram bucket label.
  return std::regex_match(name, kLabel) && name.rfind("__", 0) != 0 &&
         name != "le";
}

std::string EscapeHelp(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} with `extra` (the histogram's le) last; empty without labels.
std::string LabelText(const std::vector<std::string>& names,
                      const std::vector<std::string>& values,
                      const std::string& extra = "") {
  std::vector<std::string> pairs;
  for (size_t i = 0; i < names.size(); ++i) {
    pairs.push_back(
        absl::StrCat(names[i], "=\"", EscapeLabelValue(values[i]), "\""));
  }
  if (!extra.empty()) pairs.push_back(extra);
  if (pairs.empty()) return "";
  return absl::StrCat("{", absl::StrJoin(pairs, ","), "}");
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers (counts) exactly and without exponent, up to 2^53.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrFormat("%d", static_cast<int64_t>(value));
  }
  // The shortest form that reads back as the same double.
  for (int precision = 6; precision <= 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

void Counter::Increment(double by) {
  if (by > 0) AddToAtomic(value_, by);
}

void Gauge::Add(double delta) { AddToAtomic(value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // Buckets are few (~10); a linear scan beats a binary search's branches.
  size_t bucket = 0;
  while (bucket < upper_bounds_.size() && value > upper_bounds_[bucket]) {
    ++bucket;
  }
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_;
  return snapshot;
}

std::vector<double> DefaultBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    DieBadMetric(absl::StrFormat(
        "ExponentialBuckets(start=%g, factor=%g, count=%d): need start > 0, "
        "factor > 1, count >= 1",
        start, factor, count));
  }
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i, start *= factor) bounds.push_back(start);
  return bounds;
}

template <typename Metric>
Metric& Family<Metric>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    DieBadMetric(absl::StrFormat(
        "metric %s has labels {%s}; WithLabels got %d values {%s}", name_,
        absl::StrJoin(label_names_, ","), values.size(),
        absl::StrJoin(values, ",")));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Metric>& child = children_[values];
  if (child == nullptr) child = make_();
  return *child;
}

template <typename Metric>
void Family<Metric>::Clear() {
  absl::MutexLock lock(&mu_);
  children_.clear();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

MetricsRegistry::Entry& MetricsRegistry::Register(
    const std::string& name, Type type, const std::string& help,
    const std::vector<std::string>& label_names,
    const std::vector<double>& upper_bounds) {
  if (!ValidMetricName(name)) {
    DieBadMetric(absl::StrCat("'", name,
                              "' is no valid Prometheus metric name "
                              "([a-zA-Z_:][a-zA-Z0-9_:]*)"));
  }
  for (const std::string& label : label_names) {
    if (!ValidLabelName(label)) {
      DieBadMetric(absl::StrCat("metric ", name, ": '", label,
                                "' is no valid label name "
                                "([a-zA-Z_][a-zA-Z0-9_]*, not __*, not le)"));
    }
  }
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    const Entry& existing = it->second;
    if (existing.type != type || existing.label_names != label_names ||
        existing.upper_bounds != upper_bounds) {
      DieBadMetric(absl::StrCat(
          "metric ", name,
          " is registered twice with a different type, labels or buckets"));
    }
    return it->second;
  }
  Entry& entry = entries_[name];
  entry.type = type;
  entry.help = help;
  entry.label_names = label_names;
  entry.upper_bounds = upper_bounds;
  return entry;
}

CounterFamily& MetricsRegistry::AddCounter(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names) {
  absl::MutexLock lock(&mu_);
  Entry& entry = Register(name, Type::kCounter, help, label_names, {});
  if (entry.counter == nullptr) {
    entry.counter.reset(new CounterFamily(
        name, label_names, [] { return std::make_unique<Counter>(); }));
    if (label_names.empty()) entry.counter->WithLabels({});
  }
  return *entry.counter;
}

GaugeFamily& MetricsRegistry::AddGauge(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names) {
  absl::MutexLock lock(&mu_);
  Entry& entry = Register(name, Type::kGauge, help, label_names, {});
  if (entry.gauge == nullptr) {
    entry.gauge.reset(new GaugeFamily(
        name, label_names, [] { return std::make_unique<Gauge>(); }));
    if (label_names.empty()) entry.gauge->WithLabels({});
  }
  return *entry.gauge;
}

HistogramFamily& MetricsRegistry::AddHistogram(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names,
    std::vector<double> upper_bounds) {
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (std::isnan(upper_bounds[i]) || std::isinf(upper_bounds[i]) ||
        (i > 0 && upper_bounds[i] <= upper_bounds[i - 1])) {
      DieBadMetric(absl::StrCat("histogram ", name, ": bucket bounds {",
                                absl::StrJoin(upper_bounds, ","),
                                "} must be finite and strictly increasing"));
    }
  }
  absl::MutexLock lock(&mu_);
  Entry& entry =
      Register(name, Type::kHistogram, help, label_names, upper_bounds);
  if (entry.histogram == nullptr) {
    entry.histogram.reset(new HistogramFamily(
        name, label_names,
        [upper_bounds] { return std::make_unique<Histogram>(upper_bounds); }));
    if (label_names.empty()) entry.histogram->WithLabels({});
  }
  return *entry.histogram;
}

void MetricsRegistry::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

std::string MetricsRegistry::Render() const {
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks = hooks_;
  }
  for (const auto& hook : hooks) hook();

  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    const char* type = entry.type == Type::kCounter ? "counter"
                       : entry.type == Type::kGauge ? "gauge"
                                                    : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(entry.help), "\n",
                    "# TYPE ", name, " ", type, "\n");
    switch (entry.type) {
      case Type::kCounter: {
        absl::MutexLock family_lock(&entry.counter->mu_);
        for (const auto& [values, counter] : entry.counter->children_) {
          absl::StrAppend(&out, name, LabelText(entry.label_names, values), " ",
                          FormatMetricValue(counter->value()), "\n");
        }
        break;
      }
      case Type::kGauge: {
        absl::MutexLock family_lock(&entry.gauge->mu_);
        for (const auto& [values, gauge] : entry.gauge->children_) {
          absl::StrAppend(&out, name, LabelText(entry.label_names, values), " ",
                          FormatMetricValue(gauge->value()), "\n");
        }
        break;
      }
      case Type::kHistogram: {
        absl::MutexLock family_lock(&entry.histogram->mu_);
        for (const auto& [values, histogram] : entry.histogram->children_) {
          Histogram::Snapshot snapshot = histogram->Read();
          for (size_t i = 0; i <= snapshot.upper_bounds.size(); ++i) {
            std::string le = i < snapshot.upper_bounds.size()
                                 ? FormatMetricValue(snapshot.upper_bounds[i])
                                 : "+Inf";
            absl::StrAppend(&out, name, "_bucket",
                            LabelText(entry.label_names, values,
                                      absl::StrCat("le=\"", le, "\"")),
                            " ", absl::StrCat(snapshot.cumulative_counts[i]),
                            "\n");
          }
          std::string labels = LabelText(entry.label_names, values);
          absl::StrAppend(&out, name, "_sum", labels, " ",
                          FormatMetricValue(snapshot.sum), "\n", name, "_count",
                          labels, " ", absl::StrCat(snapshot.count), "\n");
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace ddprun::common
