// ddprun-rdzv-bench: rendezvous scale figures (see bench/rendezvous/README).
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "bench/rendezvous/bench.h"
#include "bench/rendezvous/hostile_load.h"

int main(int argc, char** argv) {
  ddprun::bench::BenchOptions options;
  options.server_binary = DDPRUN_RENDEZVOUS_BINARY;
  options.relay_binary = DDPRUN_RELAY_BINARY;
  double heartbeat_seconds = 3;
  CLI::App app{
      "ddprun rendezvous benchmark: join latency, heartbeat "
      "throughput, server memory, failure detection"};
  app.add_option("--server", options.server_binary,
                 "the ddprun-rendezvous binary")
      ->capture_default_str();
  app.add_option("--server-arg", options.server_args,
                 "an extra argument for --server (repeat for more), e.g. "
                 "--server-arg=--max-parked-joins=1000");
  app.add_option("--baseline", options.baseline_binary,
                 "another ddprun-rendezvous measured before --server at each "
                 "node count (interleaved)");
  app.add_option("--repeats", options.repeats,
                 "measure every node count this many times")
      ->capture_default_str();
  bool no_poll = false;
  app.add_flag("--no-poll", no_poll,
               "Joins do not say they can poll: every one is parked, as "
               "agents older than JoinRequest.poll are");
  app.add_flag("--join-only", options.join_only,
               "measure the join only (no heartbeats, no detection)");
  app.add_option("--join-batch", options.join_batches,
                 "nodes per Join message (JoinRequest.more, a relay's "
                 "batch; 1: one node per message as ddprun's agent sends); "
                 "several, e.g. 1,64: each measured at each node count, "
                 "interleaved (the --baseline server always gets 1)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--relays", options.relays,
                 "(with --join-only) also measure every node joining singly "
                 "through this many ddprun-relay processes in front of the "
                 "server (row rK)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--relay", options.relay_binary, "the ddprun-relay binary")
      ->capture_default_str();
  app.add_option("--relay-arg", options.relay_args,
                 "an extra argument for every relay (repeat for more), e.g. "
                 "--relay-arg=--batch-window-ms=5");
  app.add_option("--nodes", options.nodes, "node counts to measure")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--channels", options.channels,
                 "connections shared by the simulated agents")
      ->capture_default_str();
  app.add_option("--heartbeat-seconds", heartbeat_seconds,
                 "how long to measure heartbeat throughput")
      ->capture_default_str();
  app.add_option("--heartbeat-streams", options.heartbeat_streams,
                 "Rendezvous.Heartbeats streams that beat in the streamed "
                 "measurement")
      ->capture_default_str();
  app.add_option("--stream-window", options.stream_window,
                 "beats unanswered per stream")
      ->capture_default_str();
  app.add_flag("--idle-streams", options.idle_streams,
               "every node also holds its own open heartbeat stream during "
               "the streamed measurement (as every agent would)");
  app.add_option("--beats-per-message", options.beats_per_message,
                 "nodes' heartbeats per streamed message (a relay's batch, "
                 "HeartbeatRequest.more)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  double join_timeout_seconds = 120;
  app.add_option("--join-timeout-seconds", join_timeout_seconds,
                 "how long every node's Join may take")
      ->capture_default_str();
  bool hostile = false;
  ddprun::bench::HostileOptions hostile_options;
  app.add_flag("--hostile", hostile,
               "instead: a store hog against a job forming rounds (round "
               "latency quiet vs under load, server RSS vs the store cap)");
  app.add_option("--hostile-rounds", hostile_options.rounds_per_block,
                 "victim rounds per block (--hostile)")
      ->capture_default_str();
  app.add_option("--hostile-hog-connections", hostile_options.hog_threads,
                 "(--hostile) connections the hog Sets on, one call in flight "
                 "each")
      ->check(CLI::Range(1, 256));
  int64_t hostile_cap_mib = hostile_options.store_cap_bytes >> 20;
  app.add_option("--hostile-cap-mib", hostile_cap_mib,
                 "the store cap (--hostile), MiB")
      ->capture_default_str();
  bool no_memory_bound = false;
  app.add_flag("--hostile-no-memory-bound", no_memory_bound,
               "(--hostile) do not pass --max-memory-bytes (servers older "
               "than it)");
  CLI11_PARSE(app, argc, argv);
  // As in ddprun-rendezvous: the simulated agents' gRPC would otherwise
  // spend its time in Abseil's deadlock-detection graph (Debian's Abseil
  // keeps it on).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (hostile) {
    hostile_options.server_binary = options.server_binary;
    hostile_options.server_args = options.server_args;
    hostile_options.store_cap_bytes = hostile_cap_mib << 20;
    hostile_options.memory_bound = !no_memory_bound;
    return ddprun::bench::RunHostileBench(hostile_options);
  }
  if (options.relays > 0 && !options.join_only) {
    std::fprintf(stderr,
                 "ddprun-rdzv-bench: --relays measures the join only; add "
                 "--join-only\n");
    return 2;
  }
  options.poll = !no_poll;
  options.heartbeat_duration = absl::Seconds(heartbeat_seconds);
  options.join_timeout = absl::Seconds(join_timeout_seconds);
  return ddprun::bench::RunRendezvousBench(options);
}
