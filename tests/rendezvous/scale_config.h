#pragma once

#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

// A job of exactly `nodes` nodes with short heartbeats (100 ms interval,
// 500 ms timeout), a 1 s last call and a join timeout no fake-clock test
// reaches: what the Job tests of heartbeat budgets and polling Joins share.
inline v1::JobConfig ScaleConfig(int nodes) {
  v1::JobConfig config;
  config.set_min_nodes(nodes);
  config.set_max_nodes(nodes);
  config.set_last_call_timeout_ms(1000);
  config.set_join_timeout_ms(60000);
  config.set_heartbeat_interval_ms(100);
  config.set_heartbeat_timeout_ms(500);
  return config;
}

}  // namespace ddprun::rendezvous
