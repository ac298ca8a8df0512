#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ddprun::bench {

struct BenchOptions {
  std::string server_binary;  // ddprun-rendezvous
  std::vector<int> nodes = {100, 1000, 10000};
  int local_world_size = 8;
  int channels = 16;
  absl::Duration join_timeout = absl::Seconds(120);
  absl::Duration heartbeat_duration = absl::Seconds(3);
  int heartbeats_in_flight = 256;
  // Heartbeats on Rendezvous.Heartbeats streams: this many streams with
  // `stream_window` beats unanswered each (256 in flight, as unary). With
  // idle_streams, every node also holds its own open stream meanwhile.
  int heartbeat_streams = 64;
  int stream_window = 4;
  bool idle_streams = false;
  // Beats per streamed message (HeartbeatRequest.more; 1: none).
  int beats_per_message = 1;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // Extra arguments for server_binary (not the baseline).
  std::vector<std::string> server_args;
  // When set, each node count is measured on this server too, before
  // server_binary, `repeats` times interleaved.
  std::string baseline_binary;
  int repeats = 1;
  // The simulated agents' Joins may be answered `waiting` (AgentsOptions).
  bool poll = true;
  // Measure the join only (no heartbeat throughput or detection): rows
  // print the join columns and the RSS after the round and at the peak.
  bool join_only = false;
  // Nodes per Join message (JoinRequest.more: a relay's or a sender's batch
  // of several agents; ddprun's agent joins with its own node only). Each
  // node count is measured once per entry, interleaved; the baseline server
  // (which may not batch) always gets one node per message.
  std::vector<int> join_batches = {1};
  // When > 0 (join-only): at each node count, also a row where every node
  // joins singly through this many ddprun-relay processes in front of the
  // server (nodes spread over them), after the join_batches rows.
  int relays = 0;
  std::string relay_binary;  // ddprun-relay
  std::vector<std::string> relay_args;
};

// For each node count: a fresh server process, every node joining, the
// server's memory, heartbeat throughput, and lost-node detection. Prints one
// table row per count and server. Returns the process exit code (non-zero
// when a measurement failed).
int RunRendezvousBench(const BenchOptions& options);

}  // namespace ddprun::bench
