#pragma once

#include <string>

#include "absl/time/time.h"

namespace ddprun::bench {

struct InsightProcessOptions {
  std::string server_binary;  // ddprun-rendezvous
  int nodes = 1000;
  int nproc = 8;  // ranks per node, each with its figures
  // Block pairs (one block on each server); the roles swap every pair.
  int blocks = 8;
  absl::Duration block = absl::Seconds(4);
  // The job's heartbeat interval (the server may lengthen it for a large
  // job; the agents beat at the one it says).
  absl::Duration interval = absl::Milliseconds(250);
  int channels = 16;  // connections the simulated agents share per server
  // False: the figures alone, nobody opens the page.
  bool page = true;
  // False: the page alone, the heartbeats carry no figures.
  bool figures = true;
  // A node's figures ride on one heartbeat per this interval, as ddprun's
  // agents send them (AgentsOptions::figures_interval); infinite (the
  // default): the interval the server hands out in its assignment, as
  // ddprun's agents follow it; zero: on every heartbeat, as agents did
  // before.
  absl::Duration figures_interval = absl::InfiniteDuration();
  // The servers' --figures-budget; negative: their default.
  int64_t figures_budget = -1;
  // Beat on Rendezvous.Heartbeats streams, one per node, as ddprun's
  // agents do; false: unary calls.
  bool stream = false;
};

// The straggler figures' and the job page's cost to a whole
// ddprun-rendezvous process: two real servers, each with one job of
// `nodes` simulated agents beating at the job's rate over real gRPC. In
// each block pair one server is the baseline (heartbeats without figures,
// nobody on its page) and the other carries every rank's figures in its
// heartbeats and one open page that polls page.json once a second (the
// HTML once a block); the roles swap every pair, so that each process is
// measured in both. A block's cost is the server's CPU time (user +
// system, /proc/PID/stat: every thread, gRPC's transport and the metrics
// listener included) over its wall time. Prints each process's medians by
// role and the cost: their differences, averaged, in % of one core.
// Returns 0, or 1 when a measurement failed.
int RunInsightProcessBench(const InsightProcessOptions& options);

}  // namespace ddprun::bench
