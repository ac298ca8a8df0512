#include "bench/rendezvous/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "bench/rendezvous/server_process.h"
#include "bench/rendezvous/simulated_agents.h"

namespace ddprun::bench {

int RunRendezvousBench(const BenchOptions& options) {
  std::printf(
      "ddprun rendezvous, simulated agents over gRPC on loopback "
      "(heartbeat interval %s, timeout %s)\n",
      absl::FormatDuration(options.heartbeat_interval).c_str(),
      absl::FormatDuration(options.heartbeat_timeout).c_str());
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("%8s %14s %14s %10s %10s %10s %12s %10s %12s %14s %12s %12s\n",
              "nodes", "last_join->all", "first->all", "rss_MiB", "rss_hb_MiB",
              "peak_MiB", "heartbeats/s", "hb_cpu_us",
              absl::StrFormat("hb_cap_%ldc/s", cores).c_str(), "given_hb_ms",
              "detect_1st", "detect_all");
  int failures = 0;
  for (int n : options.nodes) {
    auto server = ServerProcess::Start(options.server_binary, {});
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    AgentsOptions agents_options;
    agents_options.endpoint = server->endpoint();
    agents_options.nodes = n;
    agents_options.local_world_size = options.local_world_size;
    agents_options.channels = options.channels;
    agents_options.heartbeat_interval = options.heartbeat_interval;
    agents_options.heartbeat_timeout = options.heartbeat_timeout;
    SimulatedAgents agents(agents_options);
    JoinResult joined = agents.JoinAll(options.join_timeout);
    long rss = server->RssKib();
    if (!joined.error.empty()) {
      std::printf("%8d join failed: %s\n", n, joined.error.c_str());
      ++failures;
      continue;
    }
    const double cpu_before = server->CpuSeconds();
    double beats = agents.HeartbeatThroughput(options.heartbeat_duration,
                                              options.heartbeats_in_flight);
    // The server's CPU per heartbeat, and the rate its cores would answer
    // with none of them taken by the simulated agents (which share them).
    const double cpu_us_per_beat =
        (server->CpuSeconds() - cpu_before) * 1e6 /
        std::max(1.0, beats * absl::ToDoubleSeconds(options.heartbeat_duration));
    const double capacity =
        cpu_us_per_beat > 0 ? cores * 1e6 / cpu_us_per_beat : 0;
    // After the round's answers went out and the nodes heartbeat: what the
    // server keeps while the job runs.
    long rss_running = server->RssKib();
    // The agents heartbeat at the interval the server handed out.
    DetectionResult detected = agents.DetectLostNode(
        agents.heartbeat_timeout() + 3 * agents.heartbeat_interval());
    long peak = server->PeakRssKib();
    std::printf(
        "%8d %12.1fms %12.1fms %10.1f %10.1f %10.1f %12.0f %10.1f %12.0f "
        "%7.0f/%-6.0f %10.0fms %10.0fms%s\n",
        n, absl::ToDoubleMilliseconds(joined.last_to_all),
        absl::ToDoubleMilliseconds(joined.first_to_all), rss / 1024.0,
        rss_running / 1024.0, peak / 1024.0, beats, cpu_us_per_beat, capacity,
        absl::ToDoubleMilliseconds(agents.heartbeat_interval()),
        absl::ToDoubleMilliseconds(agents.heartbeat_timeout()),
        absl::ToDoubleMilliseconds(detected.first_knows),
        absl::ToDoubleMilliseconds(detected.all_know),
        detected.complete ? "" : " (detection incomplete)");
    std::fflush(stdout);
    if (!detected.complete) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace ddprun::bench
