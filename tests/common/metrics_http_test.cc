// /metrics over real HTTP on loopback: a scrape returns exactly what the
// registry renders, with the exposition content type; the port is picked by
// the kernel; errors are clear. Also measures the scrape latency.
#include "common/metrics_http.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace ddprun::common {
namespace {

class MetricsHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("ddprun_rendezvous_joins_total", "Joins", {"result"})
        .WithLabels({"ok"})
        .Increment(7);
    registry_
        .AddHistogram("ddprun_store_op_seconds", "Store", {"op"},
                      DefaultBuckets())
        .WithLabels({"get"})
        .Observe(0.002);
    auto server = MetricsServer::Start({}, &registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  MetricsRegistry registry_;
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsHttpTest, ScrapeReturnsTheRegistryInTheTextFormat) {
  ASSERT_GT(server_->port(), 0);
  EXPECT_EQ(server_->url(),
            absl::StrCat("http://127.0.0.1:", server_->port(), "/metrics"));
  httplib::Client client("127.0.0.1", server_->port());
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response->body, registry_.Render());
  EXPECT_TRUE(absl::StrContains(
      response->body, "ddprun_rendezvous_joins_total{result=\"ok\"} 7\n"));

  // A later update shows in the next scrape.
  registry_.AddCounter("ddprun_rendezvous_joins_total", "Joins", {"result"})
      .WithLabels({"ok"})
      .Increment();
  response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_TRUE(absl::StrContains(
      response->body, "ddprun_rendezvous_joins_total{result=\"ok\"} 8\n"));
}

TEST_F(MetricsHttpTest, OtherPathsAreNotFound) {
  httplib::Client client("127.0.0.1", server_->port());
  auto response = client.Get("/");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 404);
}

TEST_F(MetricsHttpTest, ATakenPortIsAClearError) {
  MetricsServerOptions options;
  options.port = server_->port();
  auto second = MetricsServer::Start(options, &registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                absl::StrCat(":", server_->port())))
      << second.status();
}

TEST_F(MetricsHttpTest, ShutdownStopsServing) {
  int port = server_->port();
  server_->Shutdown();
  server_->Shutdown();  // idempotent
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  EXPECT_FALSE(client.Get("/metrics"));
}

TEST(MetricsHttpStartTest, BadOptionsAreInvalidArgument) {
  MetricsRegistry registry;
  MetricsServerOptions options;
  options.path = "metrics";
  EXPECT_EQ(MetricsServer::Start(options, &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.port = 70000;
  EXPECT_EQ(MetricsServer::Start(options, &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The scrape latency on loopback with a rendezvous-sized registry: one new
// connection per scrape, as Prometheus does by default.
TEST(MetricsHttpLatencyTest, ScrapeLatency) {
  MetricsRegistry registry;
  HistogramFamily& ops = registry.AddHistogram(
      "ddprun_store_op_seconds", "Store", {"op"}, DefaultBuckets());
  CounterFamily& failures =
      registry.AddCounter("ddprun_failures_total", "Failures", {"cause"});
  for (const char* op : {"set", "get", "add", "wait", "check", "delete"}) {
    ops.WithLabels({op}).Observe(0.001);
  }
  for (int i = 0; i < 50; ++i) {
    failures.WithLabels({absl::StrCat("cause", i)}).Increment();
  }
  auto server = MetricsServer::Start({}, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kScrapes = 200;
  std::vector<double> micros;
  size_t bytes = 0;
  for (int i = 0; i < kScrapes; ++i) {
    httplib::Client client("127.0.0.1", (*server)->port());
    absl::Time start = absl::Now();
    auto response = client.Get("/metrics");
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    ASSERT_TRUE(response);
    ASSERT_EQ(response->status, 200);
    bytes = response->body.size();
  }
  std::sort(micros.begin(), micros.end());
  double p50 = micros[kScrapes / 2];
  double p99 = micros[kScrapes * 99 / 100];
  RecordProperty("scrape_p50_us", static_cast<int>(p50));
  RecordProperty("scrape_p99_us", static_cast<int>(p99));
  std::printf(
      "metrics scrape over loopback: p50 %.0f us, p99 %.0f us, %zu "
      "bytes, %d scrapes\n",
      p50, p99, bytes, kScrapes);
}

}  // namespace
}  // namespace ddprun::common
