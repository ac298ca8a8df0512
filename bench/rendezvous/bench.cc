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
  // (Before the streams: rss_st_MiB shows what they hold.)
  long peak = server->PeakRssKib();
  // The same on streams (Rendezvous.Heartbeats): beats/s, the server's CPU
  // per beat, and the beats one server core answers (1 / CPU per beat).
  // After the detection, so that setting up one stream per node
  // (--idle-streams) cannot starve the nodes' unary beats there; the round
  // is over by then, and the answers say rejoin (the same work).
  double cpu_before_streams = 0;
  double cpu_after_streams = 0;
  long rss_streams = 0;  // with the idle streams (if any) still open
  StreamedResult streamed = agents.StreamedHeartbeats(
      options.heartbeat_duration, options.heartbeat_streams,
      options.stream_window, options.idle_streams ? n : 0,
      options.beats_per_message,
      [&] { cpu_before_streams = server->CpuSeconds(); },
      [&] {
        cpu_after_streams = server->CpuSeconds();
        rss_streams = server->RssKib();
      });
  const double stream_cpu_us =
      streamed.beats > 0 ? (cpu_after_streams - cpu_before_streams) * 1e6 /
                               static_cast<double>(streamed.beats)
                         : 0;
  std::string streamed_cells;
  if (!streamed.error.empty() || streamed.beats == 0) {
    streamed_cells = absl::StrFormat("%12s %10s %12s %10s", "-", "-", "-", "-");
  } else {
    streamed_cells = absl::StrFormat(
        "%12.0f %10.2f %12.0f %10.1f", streamed.per_second, stream_cpu_us,
        1e6 / stream_cpu_us, rss_streams / 1024.0);
  }
  std::printf(
      "%8d %-5s %12.1fms %12.1fms %12.1fms %8lld %10.1f %10.1f %10.1f %12.0f "
      "%10.1f %12.0f %12.0f %s %7.0f/%-6.0f %10.0fms %10.0fms%s%s\n",
      n, label.c_str(), absl::ToDoubleMilliseconds(joined.last_to_all),
      absl::ToDoubleMilliseconds(joined.first_to_all),
      absl::ToDoubleMilliseconds(joined.close_to_all),
      static_cast<long long>(joined.waiting_answers), rss / 1024.0,
      rss_running / 1024.0, peak / 1024.0, beats, cpu_us_per_beat, capacity,
      cpu_us_per_beat > 0 ? 1e6 / cpu_us_per_beat : 0, streamed_cells.c_str(),
      absl::ToDoubleMilliseconds(agents.heartbeat_interval()),
      absl::ToDoubleMilliseconds(agents.heartbeat_timeout()),
      absl::ToDoubleMilliseconds(detected.first_knows),
      absl::ToDoubleMilliseconds(detected.all_know),
      detected.complete ? "" : " (detection incomplete)",
      streamed.error.empty() ? ""
                             : absl::StrCat(" (streams: ", streamed.error, ")")
                                   .c_str());
  std::fflush(stdout);
  return detected.complete;
}

}  // namespace

int RunRendezvousBench(const BenchOptions& options) {
  std::printf(
      "ddprun rendezvous, simulated agents over gRPC on loopback "
      "(heartbeat interval %s, timeout %s; Joins %s; heartbeat streams %d x "
      "%d in flight%s, %d beat(s) per message)\n",
      absl::FormatDuration(options.heartbeat_interval).c_str(),
      absl::FormatDuration(options.heartbeat_timeout).c_str(),
      options.poll ? "may poll" : "all parked", options.heartbeat_streams,
      options.stream_window,
      options.idle_streams ? ", and one open stream per node" : "",
      options.beats_per_message);
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
      "%8s %-5s %14s %14s %14s %8s %10s %10s %10s %12s %10s %12s %12s %12s "
      "%10s %12s %10s %14s %12s %12s\n",
      "nodes", "srv", "last_join->all", "first->all", "rank1->all", "waits",
      "rss_MiB",
      "rss_hb_MiB", "peak_MiB", "heartbeats/s", "hb_cpu_us",
      absl::StrFormat("hb_cap_%ldc/s", cores).c_str(), "hb_per_core",
      "stream_hb/s", "st_cpu_us", "st_per_core", "rss_st_MiB", "given_hb_ms",
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
