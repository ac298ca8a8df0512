#include "bench/rendezvous/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/rendezvous/server_process.h"
#include "bench/rendezvous/simulated_agents.h"

namespace ddprun::bench {

namespace {

// One server process, one node count: one table row. False when a
// measurement failed.
bool MeasureOne(const BenchOptions& options, const std::string& label,
                const std::string& binary,
                const std::vector<std::string>& args, int n, long cores) {
  auto server = ServerProcess::Start(binary, args);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return false;
  }
  AgentsOptions agents_options;
  agents_options.endpoint = server->endpoint();
  agents_options.nodes = n;
  agents_options.local_world_size = options.local_world_size;
  agents_options.channels = options.channels;
  agents_options.heartbeat_interval = options.heartbeat_interval;
  agents_options.heartbeat_timeout = options.heartbeat_timeout;
  agents_options.poll = options.poll;
  SimulatedAgents agents(agents_options);
  JoinResult joined = agents.JoinAll(options.join_timeout);
  long rss = server->RssKib();
  if (!joined.error.empty()) {
    std::printf("%8d %-5s join failed: %s\n", n, label.c_str(),
                joined.error.c_str());
    return false;
  }
  if (options.join_only) {
    std::printf("%8d %-5s %12.1fms %12.1fms %12.1fms %8lld %10.1f %10s %10.1f\n",
                n, label.c_str(),
                absl::ToDoubleMilliseconds(joined.last_to_all),
                absl::ToDoubleMilliseconds(joined.first_to_all),
                absl::ToDoubleMilliseconds(joined.close_to_all),
                static_cast<long long>(joined.waiting_answers), rss / 1024.0,
                "-", server->PeakRssKib() / 1024.0);
    std::fflush(stdout);
    return true;
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
      "%8d %-5s %12.1fms %12.1fms %12.1fms %8lld %10.1f %10.1f %10.1f %12.0f %10.1f "
      "%12.0f %7.0f/%-6.0f %10.0fms %10.0fms%s\n",
      n, label.c_str(), absl::ToDoubleMilliseconds(joined.last_to_all),
      absl::ToDoubleMilliseconds(joined.first_to_all),
      absl::ToDoubleMilliseconds(joined.close_to_all),
      static_cast<long long>(joined.waiting_answers), rss / 1024.0,
      rss_running / 1024.0, peak / 1024.0, beats, cpu_us_per_beat, capacity,
      absl::ToDoubleMilliseconds(agents.heartbeat_interval()),
      absl::ToDoubleMilliseconds(agents.heartbeat_timeout()),
      absl::ToDoubleMilliseconds(detected.first_knows),
      absl::ToDoubleMilliseconds(detected.all_know),
      detected.complete ? "" : " (detection incomplete)");
  std::fflush(stdout);
  return detected.complete;
}

}  // namespace

int RunRendezvousBench(const BenchOptions& options) {
  std::printf(
      "ddprun rendezvous, simulated agents over gRPC on loopback "
      "(heartbeat interval %s, timeout %s; Joins %s)\n",
      absl::FormatDuration(options.heartbeat_interval).c_str(),
      absl::FormatDuration(options.heartbeat_timeout).c_str(),
      options.poll ? "may poll" : "all parked");
  std::printf("server: %s%s\n", options.server_binary.c_str(),
              options.server_args.empty()
                  ? ""
                  : absl::StrCat(" ", absl::StrJoin(options.server_args, " "))
                        .c_str());
  if (!options.baseline_binary.empty()) {
    std::printf("base:   %s\n", options.baseline_binary.c_str());
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf(
      "%8s %-5s %14s %14s %14s %8s %10s %10s %10s %12s %10s %12s %14s %12s %12s\n",
      "nodes", "srv", "last_join->all", "first->all", "rank1->all",
      "waits", "rss_MiB",
      "rss_hb_MiB", "peak_MiB", "heartbeats/s", "hb_cpu_us",
      absl::StrFormat("hb_cap_%ldc/s", cores).c_str(), "given_hb_ms",
      "detect_1st", "detect_all");
  int failures = 0;
  for (int repeat = 0; repeat < std::max(1, options.repeats); ++repeat) {
    for (int n : options.nodes) {
      if (!options.baseline_binary.empty() &&
          !MeasureOne(options, "base", options.baseline_binary, {}, n, cores)) {
        ++failures;
      }
      if (!MeasureOne(options, "this", options.server_binary,
                      options.server_args, n, cores)) {
        ++failures;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace ddprun::bench
