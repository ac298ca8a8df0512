#include "bench/rendezvous/insight_process.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/rendezvous/server_process.h"
#include "bench/rendezvous/simulated_agents.h"
#include "httplib.h"

namespace ddprun::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The metrics listener's port, from "<program> metrics on http://H:P/...".
std::optional<int> MetricsPort(const ServerProcess& server) {
  if (server.more_lines().empty()) return std::nullopt;
  const std::string& line = server.more_lines()[0];
  size_t at = line.find("http://");
  if (at == std::string::npos) return std::nullopt;
  std::string host_port = line.substr(at + 7);
  host_port = host_port.substr(0, host_port.find('/'));
  size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return std::nullopt;
  }
  return port;
}

// One server with its job of simulated agents, and its blocks' figures by
// role (0: baseline, 1: figures and page).
struct Side {
  std::optional<ServerProcess> server;
  std::unique_ptr<SimulatedAgents> agents;
  int metrics_port = 0;
  std::vector<double> core_fraction[2];  // CPU s / wall s, one per block
  std::vector<double> beats_per_s[2];
  size_t page_bytes = 0;
  int page_errors = 0;
};

bool StartSide(const InsightProcessOptions& options, Side& side) {
  std::vector<std::string> flags = {"--metrics-port", "0"};
  if (options.figures_budget >= 0) {
    flags.push_back("--figures-budget");
    flags.push_back(std::to_string(options.figures_budget));
  }
  auto server = ServerProcess::Start(options.server_binary, flags,
                                     "ddprun-rendezvous", /*more_lines=*/1);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return false;
  }
  side.server.emplace(*std::move(server));
  std::optional<int> port = MetricsPort(*side.server);
  if (!port.has_value()) {
    std::fprintf(stderr, "no metrics URL in the server's output\n");
    return false;
  }
  side.metrics_port = *port;
  AgentsOptions agents;
  agents.endpoint = side.server->endpoint();
  agents.nodes = options.nodes;
  agents.local_world_size = options.nproc;
  agents.channels = options.channels;
  agents.heartbeat_interval = options.interval;
  agents.figures_interval = options.figures_interval;
  // Each job is silent while the other's block runs.
  agents.heartbeat_timeout = absl::Hours(1);
  side.agents = std::make_unique<SimulatedAgents>(agents);
  JoinResult joined = side.agents->JoinAll(absl::Seconds(120));
  if (!joined.error.empty()) {
    std::fprintf(stderr, "join failed: %s\n", joined.error.c_str());
    return false;
  }
  return true;
}

// One block on `side`: paced heartbeats (with figures and an open page
// when `insight`), the server's CPU over the block's wall time.
void MeasureBlock(const InsightProcessOptions& options, bool insight,
                  Side& side) {
  absl::Notification done;
  std::thread page;
  if (insight && options.page) {
    page = std::thread([&] {
      httplib::Client client("127.0.0.1", side.metrics_port);
      auto html = client.Get("/jobs/bench");
      if (!html || html->status != 200) ++side.page_errors;
      while (true) {
        auto json = client.Get("/jobs/bench/page.json");
        if (!json || json->status != 200) {
          ++side.page_errors;
        } else {
          side.page_bytes = json->body.size();
        }
        if (done.WaitForNotificationWithTimeout(absl::Seconds(1))) return;
      }
    });
  }
  const double cpu_before = side.server->CpuSeconds();
  const absl::Time start = absl::Now();
  const bool figures = insight && options.figures;
  const int64_t beats =
      options.stream
          ? side.agents->PacedStreamHeartbeats(options.block, figures)
          : side.agents->PacedHeartbeats(options.block, figures);
  done.Notify();
  if (page.joinable()) page.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  side.core_fraction[insight].push_back(
      (side.server->CpuSeconds() - cpu_before) / wall);
  side.beats_per_s[insight].push_back(beats / wall);
}

}  // namespace

int RunInsightProcessBench(const InsightProcessOptions& options) {
  // Two processes, each taking both roles in turn: whatever one process
  // costs more than the other (where its threads landed, the order they
  // started in) is in both of its roles and cancels in its difference.
  Side sides[2];
  if (!StartSide(options, sides[0]) || !StartSide(options, sides[1])) {
    return 1;
  }
  // Warm both (connections, the figures' first window), unmeasured.
  for (Side& side : sides) {
    if (options.stream) {
      side.agents->PacedStreamHeartbeats(absl::Seconds(1), true);
    } else {
      side.agents->PacedHeartbeats(absl::Seconds(1), true);
    }
  }
  for (int b = 0; b < options.blocks; ++b) {
    // Block b: process b % 2 takes the figures and the page, the other is
    // the baseline; which of the two runs first alternates every two.
    const int with = b % 2;
    const bool baseline_first = (b / 2) % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool insight = (k == 0) != baseline_first;
      MeasureBlock(options, insight, sides[insight ? with : 1 - with]);
    }
    std::printf(
        "block %d: baseline (process %d) %.2f%% of a core, with %s (process "
        "%d) %.2f%%\n",
        b + 1, 1 - with, sides[1 - with].core_fraction[0].back() * 100,
        !options.figures ? "page"
        : options.page   ? "figures and page"
                         : "figures",
        with, sides[with].core_fraction[1].back() * 100);
    std::fflush(stdout);
  }
  double cost = 0;
  const char* what = !options.figures ? "page"
                     : options.page   ? "figures and page"
                                      : "figures";
  std::printf(
      "ddprun-rendezvous processes, %d nodes x %d ranks, heartbeat interval "
      "%.0f ms (the server's), figures every %.0f ms, %s heartbeats, %d "
      "block pairs of %.1f s\n",
      options.nodes, options.nproc,
      absl::ToDoubleMilliseconds(sides[0].agents->heartbeat_interval()),
      absl::ToDoubleMilliseconds(
          std::max(sides[0].agents->figures_interval(),
                   sides[0].agents->heartbeat_interval())),
      options.stream ? "streamed" : "unary", options.blocks,
      absl::ToDoubleSeconds(options.block));
  for (int p = 0; p < 2; ++p) {
    const Side& side = sides[p];
    if (side.core_fraction[0].empty() || side.core_fraction[1].empty()) {
      std::printf("process %d: too few blocks for both roles (--blocks 2+)\n",
                  p);
      return 1;
    }
    const double base = Median(side.core_fraction[0]);
    const double with = Median(side.core_fraction[1]);
    cost += (with - base) / 2;
    std::printf(
        "process %d: baseline %.2f%% of one core (%.0f heartbeats/s), with "
        "%s %.2f%% (%.0f heartbeats/s): %+.2f%%\n",
        p, base * 100, Median(side.beats_per_s[0]), what, with * 100,
        Median(side.beats_per_s[1]), (with - base) * 100);
  }
  std::printf(
      "cost of the %s (page.json %zu bytes once a second): %.2f%% of one "
      "core (the two processes' differences of medians, averaged)\n",
      !options.figures ? "open page alone"
      : options.page   ? "figures and one open page"
                       : "figures alone",
      std::max(sides[0].page_bytes, sides[1].page_bytes), cost * 100);
  if (sides[0].page_errors + sides[1].page_errors > 0) {
    std::printf("page requests failed: %d\n",
                sides[0].page_errors + sides[1].page_errors);
    return 1;
  }
  return 0;
}

}  // namespace ddprun::bench
