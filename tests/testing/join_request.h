#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::testing {

// What varies between the rendezvous tests' simulated nodes.
struct NodeJoinOptions {
  int local_world_size = 1;
  int64_t heartbeat_timeout_ms = 3000;
  int64_t last_call_timeout_ms = 0;  // 0: the server's default
  int max_restarts = 0;
};

// The Join of simulated node `node` of an `nnodes`-node job: no node rank
// asked, address "host-<node>", MASTER_PORT 5000, heartbeats every 100 ms.
inline v1::JoinRequest NodeJoin(const std::string& run_id,
                                const std::string& node, int nnodes,
                                const NodeJoinOptions& options = {}) {
  v1::JoinRequest request;
  request.set_run_id(run_id);
  request.set_node_id(node);
  request.set_local_world_size(options.local_world_size);
  request.set_node_rank(-1);
  request.set_address("host-" + node);
  request.set_master_port(5000);
  v1::JobConfig* config = request.mutable_config();
  config->set_min_nodes(nnodes);
  config->set_max_nodes(nnodes);
  config->set_heartbeat_interval_ms(100);
  config->set_heartbeat_timeout_ms(options.heartbeat_timeout_ms);
  config->set_max_restarts(options.max_restarts);
  if (options.last_call_timeout_ms > 0) {
    config->set_last_call_timeout_ms(options.last_call_timeout_ms);
  }
  return request;
}

}  // namespace ddprun::testing
