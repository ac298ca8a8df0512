// ddprun-rdzv-bench: rendezvous scale figures (see bench/rendezvous/README).
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/rendezvous/bench.h"

int main(int argc, char** argv) {
  ddprun::bench::BenchOptions options;
  options.server_binary = DDPRUN_RENDEZVOUS_BINARY;
  double heartbeat_seconds = 3;
  CLI::App app{
      "ddprun rendezvous benchmark: join latency, heartbeat "
      "throughput, server memory, failure detection"};
  app.add_option("--server", options.server_binary,
                 "the ddprun-rendezvous binary")
      ->capture_default_str();
  app.add_option("--nodes", options.nodes, "node counts to measure")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--channels", options.channels,
                 "connections shared by the simulated agents")
      ->capture_default_str();
  app.add_option("--heartbeat-seconds", heartbeat_seconds,
                 "how long to measure heartbeat throughput")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.heartbeat_duration = absl::Seconds(heartbeat_seconds);
  return ddprun::bench::RunRendezvousBench(options);
}
