#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::bench {

struct HostileOptions {
  std::string server_binary;  // ddprun-rendezvous
  // Extra arguments for server_binary (--server-arg), e.g. its write rate.
  std::vector<std::string> server_args;
  int victim_nodes = 8;
  int rounds_per_block = 40;
  // Quiet and hostile blocks alternate this many times each, so that both
  // conditions see the same drift of a shared machine.
  int blocks = 3;
  // --max-store-bytes and --max-job-store-bytes: the hog may fill it all.
  int64_t store_cap_bytes = int64_t{256} << 20;
  // Also --max-memory-bytes = the cap (the server's whole resident memory);
  // false for servers older than that flag.
  bool memory_bound = true;
  // The hog's connections, each a thread with one Set in flight.
  int hog_threads = 2;
  int hog_value_bytes = 1 << 20;
};

// A store hog against a job that forms rounds: one ddprun-rendezvous with
// a token and a store cap; job "hog" Sets 1 MiB values as fast as it can
// (refused at the cap) on its own connections while job "victim" (its own
// job token) forms rounds: every node Joins, node 0 Sets and Gets a key in
// the round's scope, then reports a failure to end the round. Prints the
// victim's round latency (p50/p99) quiet and under the hog, the hog's
// refusals, and the server's RSS against the cap. Returns the exit code
// (non-zero when a round failed).
int RunHostileBench(const HostileOptions& options);

}  // namespace ddprun::bench
