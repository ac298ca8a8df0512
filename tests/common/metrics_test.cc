// The metrics registry's Prometheus text format, exactly as a Prometheus
// server parses it, and its thread-safety.
#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ddprun::common {
namespace {

TEST(MetricsTest, RendersEveryTypeInTheTextFormat) {
  MetricsRegistry registry;
  CounterFamily& failures = registry.AddCounter(
      "ddprun_failures_total", "Worker failures by cause", {"cause"});
  failures.WithLabels({"signal"}).Increment();
  failures.WithLabels({"exit"}).Increment(2);
  registry.AddGauge("ddprun_nodes", "Nodes in the round").WithLabels({}).Set(3);
  HistogramFamily& latency = registry.AddHistogram(
      "ddprun_store_seconds", "Store call latency", {"op"}, {0.001, 0.01});
  latency.WithLabels({"get"}).Observe(0.0005);
  latency.WithLabels({"get"}).Observe(0.005);
  latency.WithLabels({"get"}).Observe(2);

  EXPECT_EQ(registry.Render(),
            "# HELP ddprun_failures_total Worker failures by cause\n"
            "# TYPE ddprun_failures_total counter\n"
            "ddprun_failures_total{cause=\"exit\"} 2\n"
            "ddprun_failures_total{cause=\"signal\"} 1\n"
            "# HELP ddprun_nodes Nodes in the round\n"
            "# TYPE ddprun_nodes gauge\n"
            "ddprun_nodes 3\n"
            "# HELP ddprun_store_seconds Store call latency\n"
            "# TYPE ddprun_store_seconds histogram\n"
            "ddprun_store_seconds_bucket{op=\"get\",le=\"0.001\"} 1\n"
            "ddprun_store_seconds_bucket{op=\"get\",le=\"0.01\"} 2\n"
            "ddprun_store_seconds_bucket{op=\"get\",le=\"+Inf\"} 3\n"
            "ddprun_store_seconds_sum{op=\"get\"} 2.0055\n"
            "ddprun_store_seconds_count{op=\"get\"} 3\n");
}

TEST(MetricsTest, UnlabeledMetricsAreScrapedAsZeroBeforeTheFirstUpdate) {
  MetricsRegistry registry;
  registry.AddCounter("jobs_total", "Jobs");
  registry.AddHistogram("wait_seconds", "Waits", {}, {1});
  EXPECT_EQ(registry.Render(),
            "# HELP jobs_total Jobs\n# TYPE jobs_total counter\n"
            "jobs_total 0\n"
            "# HELP wait_seconds Waits\n# TYPE wait_seconds histogram\n"
            "wait_seconds_bucket{le=\"1\"} 0\n"
            "wait_seconds_bucket{le=\"+Inf\"} 0\n"
            "wait_seconds_sum 0\nwait_seconds_count 0\n");
}

TEST(MetricsTest, EscapesHelpAndLabelValues) {
  MetricsRegistry registry;
  registry.AddGauge("g", "a \\ b\nc", {"host"})
      .WithLabels({"x\"y\\z\nw"})
      .Set(1);
  EXPECT_EQ(registry.Render(),
            "# HELP g a \\\\ b\\nc\n# TYPE g gauge\n"
            "g{host=\"x\\\"y\\\\z\\nw\"} 1\n");
}

TEST(MetricsTest, FormatsNumbersAsPrometheusReadsThem) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
  EXPECT_EQ(FormatMetricValue(0.005), "0.005");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()),
            "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
}

TEST(MetricsTest, RegisteringTheSameShapeTwiceReturnsTheSameFamily) {
  MetricsRegistry registry;
  CounterFamily& a = registry.AddCounter("c_total", "C", {"x"});
  CounterFamily& b = registry.AddCounter("c_total", "C", {"x"});
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(&a.WithLabels({"1"}), &b.WithLabels({"1"}));
}

TEST(MetricsTest, CountersNeverGoDown) {
  MetricsRegistry registry;
  Counter& c = registry.AddCounter("c_total", "C").WithLabels({});
  c.Increment(5);
  c.Increment(-2);
  EXPECT_EQ(c.value(), 5);
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry registry;
  CounterFamily& family = registry.AddCounter("ops_total", "Ops", {"op"});
  Histogram& histogram =
      registry.AddHistogram("h", "H", {}, {0.5}).WithLabels({});
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        family.WithLabels({i % 2 ? "get" : "set"}).Increment();
        histogram.Observe(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(family.WithLabels({"get"}).value(), kThreads * kPerThread / 2);
  EXPECT_EQ(family.WithLabels({"set"}).value(), kThreads * kPerThread / 2);
  EXPECT_EQ(histogram.Read().count, uint64_t{kThreads * kPerThread});
}

TEST(MetricsTest, CollectHooksRunBeforeEachRender) {
  MetricsRegistry registry;
  Gauge& jobs = registry.AddGauge("jobs", "Jobs").WithLabels({});
  int scrapes = 0;
  registry.AddCollectHook([&] { jobs.Set(++scrapes * 10); });
  EXPECT_NE(registry.Render().find("jobs 10\n"), std::string::npos);
  EXPECT_NE(registry.Render().find("jobs 20\n"), std::string::npos);
}

TEST(MetricsTest, ClearDropsChildrenOfJobsThatAreGone) {
  MetricsRegistry registry;
  GaugeFamily& rounds = registry.AddGauge("round", "Round", {"run_id"});
  std::vector<std::string> jobs = {"a", "b"};
  registry.AddCollectHook([&] {
    rounds.Clear();
    for (const std::string& job : jobs) rounds.WithLabels({job}).Set(1);
  });
  EXPECT_NE(registry.Render().find("round{run_id=\"b\"} 1\n"),
            std::string::npos);
  jobs = {"a"};
  std::string text = registry.Render();
  EXPECT_NE(text.find("round{run_id=\"a\"} 1\n"), std::string::npos);
  EXPECT_EQ(text.find("run_id=\"b\""), std::string::npos) << text;
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 3),
            (std::vector<double>{0.001, 0.01, 0.1}));
}

using MetricsDeathTest = ::testing::Test;

TEST(MetricsDeathTest, MisuseAbortsNamingTheMetric) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  MetricsRegistry registry;
  CounterFamily& family = registry.AddCounter("c_total", "C", {"a", "b"});
  EXPECT_DEATH(family.WithLabels({"only-one"}), "c_total has labels \\{a,b\\}");
  EXPECT_DEATH(registry.AddCounter("bad-name", "x"), "bad-name");
  EXPECT_DEATH(registry.AddCounter("x_total", "x", {"__reserved"}),
               "__reserved");
  EXPECT_DEATH(registry.AddGauge("c_total", "C", {"a", "b"}),
               "c_total is registered twice");
  EXPECT_DEATH(registry.AddHistogram("h", "H", {}, {1, 1}), "strictly");
}

}  // namespace
}  // namespace ddprun::common
