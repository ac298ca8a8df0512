#include "bench/rendezvous/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/rendezvous/server_process.h"
#include "bench/rendezvous/simulated_agents.h"
#include "httplib.h"

namespace ddprun::bench {

namespace {

// Where last join -> all ranked went (printed under each row): the phases,
// the CPU-seconds of the server, the simulated agents, the machine's other
// processes and its idle cores in that window, the server's CPU per node
// and the rate it would sustain alone on every core, and how the polls
// were timed against the close.
void PrintAccounting(const JoinResult& j, int n, long cores) {
  if (j.all_ranked.at == absl::InfinitePast() ||
      j.first_sent.at == absl::InfinitePast()) {
    return;
  }
  auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
  const CpuSample& a = j.last_sent;
  const CpuSample& b = j.all_ranked;
  const double wall = absl::ToDoubleSeconds(b.at - a.at);
  const double server = b.server_s - a.server_s;
  const double agents = b.agents_s - a.agents_s;
  const double busy = b.busy_s - a.busy_s;
  const double idle = b.idle_s - a.idle_s;
  const double others = std::max(0.0, busy - server - agents);
  // The whole join (first Join sent -> every node ranked): every call of
  // every node, waiting answers and polls included.
  const double server_all = b.server_s - j.first_sent.server_s;
  const double agents_all = b.agents_s - j.first_sent.agents_s;
  const double us_per_node = server_all * 1e6 / std::max(1, n);
  std::printf(
      "         phases: send %.0f ms, last sent -> close %.0f ms, close -> all "
      "%.0f ms\n",
      ms(j.last_sent.at - j.first_sent.at), ms(j.closed.at - j.last_sent.at),
      ms(j.all_ranked.at - j.closed.at));
  std::printf(
      "         last->all %.2f s x %ld cores = %.2f core-s: server %.2f, "
      "agents %.2f, other processes %.2f, idle %.2f\n",
      wall, cores, wall * static_cast<double>(cores), server, agents, others,
      idle);
  std::printf(
      "         whole join: server %.2f CPU-s = %.1f us/node (%.0f nodes/s "
      "on %ld cores alone), agents %.2f CPU-s = %.1f us/node; server's "
      "last->all CPU / %ld cores = %.0f ms (its floor with every core)\n",
      server_all, us_per_node,
      us_per_node > 0 ? static_cast<double>(cores) * 1e6 / us_per_node : 0,
      cores, agents_all, agents_all * 1e6 / std::max(1, n), cores,
      server * 1e3 / static_cast<double>(cores));
  if (j.polls > 0 || j.waiting_answers > 0) {
    std::printf(
        "         polls %lld (%lld after the close; %lld answered waiting "
        "after it), %d nodes answered on their first Join; last poll due "
        "close+%.0f ms, last sent close+%.0f ms, sent late by %.1f ms mean / "
        "%.0f ms worst\n",
        static_cast<long long>(j.polls),
        static_cast<long long>(j.polls_after_close),
        static_cast<long long>(j.waits_after_close), j.parked_answers,
        ms(j.last_poll_due), ms(j.last_poll_sent), ms(j.mean_poll_late),
        ms(j.max_poll_late));
  }
}

// The sum of a counter over relays' /metrics pages ("... metrics on URL"
// lines); -1 when one could not be read.
double SumRelayCounter(const std::vector<ServerProcess>& relays,
                       const std::string& name) {
  double sum = 0;
  for (const ServerProcess& relay : relays) {
    if (relay.more_lines().empty()) return -1;
    absl::string_view url = relay.more_lines()[0];
    size_t at = url.find("http://");
    if (at == absl::string_view::npos) return -1;
    url.remove_prefix(at + 7);
    std::vector<std::string> host_port =
        absl::StrSplit(url.substr(0, url.find('/')), ':');
    int port = 0;
    if (host_port.size() != 2 || !absl::SimpleAtoi(host_port[1], &port)) {
      return -1;
    }
    httplib::Client client(host_port[0], port);
    auto response = client.Get("/metrics");
    if (!response) return -1;
    double value = -1;
    for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
      if (absl::ConsumePrefix(&line, name + " ") &&
          absl::SimpleAtod(line, &value)) {
        break;
      }
    }
    if (value < 0) return -1;
    sum += value;
  }
  return sum;
}

// One server process, one node count, `join_batch` nodes per Join message
// (or one each through `relays` ddprun-relay processes): one table row.
// False when a measurement failed.
bool MeasureOne(const BenchOptions& options, const std::string& label,
                const std::string& binary, const std::vector<std::string>& args,
                int n, long cores, int join_batch, int relays = 0) {
  auto server = ServerProcess::Start(binary, args);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return false;
  }
  AgentsOptions agents_options;
  agents_options.endpoint = server->endpoint();
  std::vector<ServerProcess> relay_processes;
  for (int i = 0; i < relays; ++i) {
    std::vector<std::string> relay_args = {"--upstream", server->endpoint(),
                                           "--metrics-port", "0"};
    relay_args.insert(relay_args.end(), options.relay_args.begin(),
                      options.relay_args.end());
    auto relay = ServerProcess::Start(options.relay_binary, relay_args,
                                      "ddprun-relay", /*more_lines=*/1);
    if (!relay.ok()) {
      std::fprintf(stderr, "%s\n", relay.status().ToString().c_str());
      return false;
    }
    agents_options.endpoints.push_back(relay->endpoint());
    relay_processes.push_back(*std::move(relay));
  }
  agents_options.nodes = n;
  agents_options.local_world_size = options.local_world_size;
  agents_options.channels = options.channels;
  agents_options.heartbeat_interval = options.heartbeat_interval;
  agents_options.heartbeat_timeout = options.heartbeat_timeout;
  agents_options.poll = options.poll;
  agents_options.join_batch = join_batch;
  const ServerProcess* process = &*server;
  agents_options.server_cpu_seconds = [process] {
    return process->CpuSeconds();
  };
  SimulatedAgents agents(agents_options);
  JoinResult joined = agents.JoinAll(options.join_timeout);
  long rss = server->RssKib();
  if (!joined.error.empty()) {
    std::printf("%8d %-5s join failed: %s\n", n, label.c_str(),
                joined.error.c_str());
    return false;
  }
  if (options.join_only) {
    std::printf(
        "%8d %-5s %12.1fms %12.1fms %12.1fms %8lld %10.1f %10s %10.1f\n", n,
        label.c_str(), absl::ToDoubleMilliseconds(joined.last_to_all),
        absl::ToDoubleMilliseconds(joined.first_to_all),
        absl::ToDoubleMilliseconds(joined.close_to_all),
        static_cast<long long>(joined.waiting_answers), rss / 1024.0, "-",
        server->PeakRssKib() / 1024.0);
    PrintAccounting(joined, n, cores);
    if (relays > 0) {
      double relay_cpu = 0;
      for (const ServerProcess& relay : relay_processes) {
        relay_cpu += relay.CpuSeconds();
      }
      std::printf(
          "         %d relays: %.0f single Joins in %.0f upstream Join calls "
          "(the server's calls); relays' CPU %.2f s, server's %.2f s\n",
          relays, SumRelayCounter(relay_processes, "ddprun_relay_joins_total"),
          SumRelayCounter(relay_processes,
                          "ddprun_relay_upstream_join_calls_total"),
          relay_cpu, server->CpuSeconds());
    }
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
    streamed_cells = absl::StrFormat("%12.0f %10.2f %12.0f %10.1f",
                                     streamed.per_second, stream_cpu_us,
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
      streamed.error.empty()
          ? ""
          : absl::StrCat(" (streams: ", streamed.error, ")").c_str());
  PrintAccounting(joined, n, cores);
  std::fflush(stdout);
  return detected.complete;
}

}  // namespace

int RunRendezvousBench(const BenchOptions& options) {
  std::printf(
      "ddprun rendezvous, simulated agents over gRPC on loopback "
      "(heartbeat interval %s, timeout %s; Joins %s; heartbeat streams %d x "
      "%d in flight%s, %d beat(s) per message; Join messages of %s "
      "node(s): srv bN)\n",
      absl::FormatDuration(options.heartbeat_interval).c_str(),
      absl::FormatDuration(options.heartbeat_timeout).c_str(),
      options.poll ? "may poll" : "all parked", options.heartbeat_streams,
      options.stream_window,
      options.idle_streams ? ", and one open stream per node" : "",
      options.beats_per_message,
      absl::StrJoin(options.join_batches, ",").c_str());
  std::printf(
      "server: %s%s\n", options.server_binary.c_str(),
      options.server_args.empty()
          ? ""
          : absl::StrCat(" ", absl::StrJoin(options.server_args, " ")).c_str());
  if (!options.baseline_binary.empty()) {
    std::printf("base:   %s\n", options.baseline_binary.c_str());
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf(
      "%8s %-5s %14s %14s %14s %8s %10s %10s %10s %12s %10s %12s %12s %12s "
      "%10s %12s %10s %14s %12s %12s\n",
      "nodes", "srv", "last_join->all", "first->all", "rank1->all", "waits",
      "rss_MiB", "rss_hb_MiB", "peak_MiB", "heartbeats/s", "hb_cpu_us",
      absl::StrFormat("hb_cap_%ldc/s", cores).c_str(), "hb_per_core",
      "stream_hb/s", "st_cpu_us", "st_per_core", "rss_st_MiB", "given_hb_ms",
      "detect_1st", "detect_all");
  int failures = 0;
  for (int repeat = 0; repeat < std::max(1, options.repeats); ++repeat) {
    for (int n : options.nodes) {
      if (!options.baseline_binary.empty() &&
          !MeasureOne(options, "base", options.baseline_binary, {}, n, cores,
                      /*join_batch=*/1)) {
        ++failures;
      }
      // "this": one node per Join message; "bN": N per message.
      for (int batch : options.join_batches) {
        const std::string label =
            batch <= 1 ? "this" : absl::StrCat("b", batch);
        if (!MeasureOne(options, label, options.server_binary,
                        options.server_args, n, cores, batch)) {
          ++failures;
        }
      }
      // "rK": one node per Join, through K relays.
      if (options.relays > 0 &&
          !MeasureOne(options, absl::StrCat("r", options.relays),
                      options.server_binary, options.server_args, n, cores,
                      /*join_batch=*/1, options.relays)) {
        ++failures;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace ddprun::bench
